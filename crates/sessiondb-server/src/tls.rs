//! TLS for the server's connections (OpenSSL through native-tls): a certificate chain and its
//! key in PEM, replaceable while serving, so a renewed certificate needs no restart. A client
//! may choose HTTP/2 by ALPN (`h2`, preferred) or HTTP/1.1; one that names neither gets HTTP/1.1.

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
    /// From a PEM certificate chain (the server's certificate first) and its private key in
    /// PKCS#8 PEM (`BEGIN PRIVATE KEY`; `openssl pkcs8 -topk8 -nocrypt` converts other forms).
    /// The pair must complete a handshake: a key that is not the certificate's is refused here
    /// rather than failing every connection.
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

fn unusable(reason: impl std::fmt::Display) -> ServerError {
    ServerError::Tls {
        reason: reason.to_string(),
    }
}

fn acceptor(certificate_chain: &[u8], key: &[u8]) -> Result<TlsAcceptor, ServerError> {
    let identity = Identity::from_pkcs8(certificate_chain, key).map_err(unusable)?;
    let acceptor = NativeAcceptor::builder(identity)
        .accept_alpn(&["h2", "http/1.1"])
        .build()
        .map_err(unusable)?;
    #[cfg(unix)]
    completes_a_handshake(&acceptor)?;
    Ok(TlsAcceptor::from(acceptor))
}

/// Runs one handshake with `acceptor` over a socket pair. OpenSSL takes a certificate whose key
/// is another's without a word (it drops the key, and then every handshake fails), so this is
/// what tells a mismatched pair. The client checks no chain or name, only that the server holds
/// the key of the certificate it presents, which every TLS handshake proves.
#[cfg(unix)]
fn completes_a_handshake(acceptor: &NativeAcceptor) -> Result<(), ServerError> {
    use std::time::Duration;
    use tokio_native_tls::native_tls::TlsConnector;
    let (server_end, client_end) = std::os::unix::net::UnixStream::pair().map_err(unusable)?;
    for end in [&server_end, &client_end] {
        end.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(unusable)?;
    }
    let acceptor = acceptor.clone();
    let server = std::thread::spawn(move || acceptor.accept(server_end).map(drop));
    let connector = TlsConnector::builder()
        .danger_accept_invalid_certs(true)
        .danger_accept_invalid_hostnames(true)
        .build()
        .map_err(unusable)?;
    let client = connector.connect("localhost", client_end).map(drop);
    let server = server
        .join()
        .map_err(|_| unusable("the handshake check panicked"))?;
    server.and(client).map_err(|error| {
        unusable(format!(
            "a handshake with it fails (is the key the certificate's?): {error}"
        ))
    })
}
