//! TLS for the server's connections (OpenSSL through native-tls): a certificate chain and its
//! key in PEM, replaceable while serving, so a renewed certificate needs no restart.

use std::sync::{Arc, RwLock};

use tokio_native_tls::TlsAcceptor;
use tokio_native_tls::native_tls::{Identity, TlsAcceptor as NativeAcceptor};

use crate::ServerError;

/// The certificate new connections are offered; clones share it.
#[derive(Clone)]
pub struct Tls {
    acceptor: Arc<RwLock<TlsAcceptor>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// From a PEM certificate chain (the server's certificate first) and its private key (PEM:
    /// PKCS#8, or the RSA and EC forms OpenSSL writes).
    pub fn from_pem(certificate_chain: &[u8], key: &[u8]) -> Result<Self, ServerError> {
        Ok(Self {
            acceptor: Arc::new(RwLock::new(acceptor(certificate_chain, key)?)),
        })
    }

    /// Offers this certificate to every connection from now on; connections already open keep
    /// theirs. A chain or key that is not usable changes nothing.
    pub fn replace_pem(&self, certificate_chain: &[u8], key: &[u8]) -> Result<(), ServerError> {
        let replacement = acceptor(certificate_chain, key)?;
        *self.acceptor.write().unwrap_or_else(|p| p.into_inner()) = replacement;
        Ok(())
    }

    pub(crate) fn current(&self) -> TlsAcceptor {
        self.acceptor
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn acceptor(certificate_chain: &[u8], key: &[u8]) -> Result<TlsAcceptor, ServerError> {
    let unusable = |error: tokio_native_tls::native_tls::Error| ServerError::Tls {
        reason: error.to_string(),
    };
    let identity = Identity::from_pkcs8(certificate_chain, key).map_err(unusable)?;
    let acceptor = NativeAcceptor::builder(identity)
        .build()
        .map_err(unusable)?;
    Ok(TlsAcceptor::from(acceptor))
}
