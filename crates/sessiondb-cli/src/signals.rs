//! Requests an operator sends a running server as Unix signals: SIGUSR1 for a backup, SIGUSR2
//! for a vacuum, SIGHUP to reload the API keys and TLS certificate. Every server listens for all three from its
//! start, so a signal it cannot act on is logged instead of meeting the default action, which
//! ends the process.

use anyhow::Context;

#[derive(Debug, Clone, Copy)]
enum Signal {
    Usr1,
    Usr2,
    Hup,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Usr1 => "SIGUSR1",
            Signal::Usr2 => "SIGUSR2",
            Signal::Hup => "SIGHUP",
        }
    }
}

pub struct Requests {
    signal: Signal,
    /// What the signal asks for, for the log.
    asks_for: &'static str,
    #[cfg(unix)]
    listener: tokio::signal::unix::Signal,
}

impl Requests {
    /// SIGUSR1. Listens from here on (before the server says it is listening); needs a runtime.
    pub fn backups() -> anyhow::Result<Self> {
        Self::listen(Signal::Usr1, "a backup")
    }

    /// SIGUSR2, as [`Requests::backups`].
    pub fn vacuums() -> anyhow::Result<Self> {
        Self::listen(Signal::Usr2, "a vacuum")
    }

    /// SIGHUP, as [`Requests::backups`].
    pub fn reloads() -> anyhow::Result<Self> {
        Self::listen(Signal::Hup, "a reload of the API keys and certificate")
    }

    fn listen(signal: Signal, asks_for: &'static str) -> anyhow::Result<Self> {
        #[cfg(unix)]
        let kind = match signal {
            Signal::Usr1 => tokio::signal::unix::SignalKind::user_defined1(),
            Signal::Usr2 => tokio::signal::unix::SignalKind::user_defined2(),
            Signal::Hup => tokio::signal::unix::SignalKind::hangup(),
        };
        Ok(Self {
            signal,
            asks_for,
            #[cfg(unix)]
            listener: tokio::signal::unix::signal(kind)
                .with_context(|| format!("listening for {}", signal.name()))?,
        })
    }

    /// The next request.
    pub async fn next(&mut self) {
        #[cfg(unix)]
        self.listener.recv().await;
        #[cfg(not(unix))]
        std::future::pending::<()>().await;
        tracing::info!("{} requested ({})", self.asks_for, self.signal.name());
    }

    /// For a server that cannot act on them: says so at each request.
    pub async fn refuse(mut self, why: &'static str) {
        loop {
            self.next().await;
            tracing::warn!(
                "{} asks for {}, but {why}",
                self.signal.name(),
                self.asks_for
            );
        }
    }
}
