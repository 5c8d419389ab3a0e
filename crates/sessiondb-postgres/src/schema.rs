//! Numbered migrations, applied in order inside one transaction that holds an advisory lock, so
//! instances starting together migrate once.

use tokio_postgres::Client;

use crate::PgError;

const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_branch_points.sql"),
    include_str!("../migrations/0003_unaccent.sql"),
    include_str!("../migrations/0004_session_versions.sql"),
    include_str!("../migrations/0005_deleted_versions.sql"),
];

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Any constant of our own: the key of the advisory lock migrations take.
const MIGRATION_LOCK: i64 = 0x5E55_10DB;

/// The schema version the database records (0 for none); a version newer than this build's is
/// refused.
pub(crate) async fn found_version(c: &impl tokio_postgres::GenericClient) -> Result<i64, PgError> {
    let found: i64 = c
        .query_one(
            "SELECT coalesce(max(version), 0) FROM sessiondb_schema",
            &[],
        )
        .await?
        .get(0);
    if found > SCHEMA_VERSION {
        return Err(PgError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(found)
}

/// Brings the database to [`SCHEMA_VERSION`]; returns the version it found. Refuses a database
/// written by a newer build.
pub async fn migrate(client: &mut Client) -> Result<i64, PgError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS sessiondb_schema (
             version    BIGINT NOT NULL PRIMARY KEY,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let found = found_version(&tx).await?;
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = index as i64 + 1;
        tx.batch_execute(sql)
            .await
            .map_err(|e| PgError::Migration {
                version,
                reason: PgError::from(e).to_string(),
            })?;
        tx.execute(
            "INSERT INTO sessiondb_schema (version) VALUES ($1)",
            &[&version],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(found)
}
