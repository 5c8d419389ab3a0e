//! sessiondb's PostgreSQL backend, for several stateless server instances on one shared
//! database. In progress: this crate has the schema (numbered migrations, every table led by
//! `(namespace, session_id)` for distribution by session), the connection pool, and
//! [`cluster::TempCluster`], the throw-away cluster its tests start themselves. The
//! [`sessiondb_core::Store`] implementation comes next (see ARCHITECTURE.md).
#![forbid(unsafe_code)]

pub mod cluster;
mod schema;

pub use schema::{SCHEMA_VERSION, migrate};

use sessiondb_core::StoreError;

/// Errors of this backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("connection pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("bad connection string: {0}")]
    Config(String),
    #[error("the database schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew { found: i64, supported: i64 },
}

impl From<PgError> for StoreError {
    fn from(e: PgError) -> Self {
        match e {
            PgError::SchemaTooNew { found, supported } => {
                StoreError::SchemaTooNew { found, supported }
            }
            other => StoreError::Backend(other.to_string()),
        }
    }
}

/// A pool of connections to one database, migrated to [`SCHEMA_VERSION`].
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: deadpool_postgres::Pool,
}

impl PgStore {
    /// Connects to `url` (`postgres://user@host:port/db`) with at most `max_connections`
    /// connections and applies the migrations this database lacks.
    pub async fn connect(url: &str, max_connections: usize) -> Result<Self, PgError> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| PgError::Config(e.to_string()))?;
        let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(max_connections.max(1))
            .build()
            .map_err(|e| PgError::Config(e.to_string()))?;
        let mut client = pool.get().await?;
        migrate(&mut client).await?;
        Ok(Self { pool })
    }

    /// The schema version recorded in the database.
    pub async fn schema_version(&self) -> Result<i64, PgError> {
        let client = self.pool.get().await?;
        Ok(client
            .query_one("SELECT max(version) FROM sessiondb_schema", &[])
            .await?
            .get(0))
    }
}
