//! The shared conformance suite and the model test, on a real SQLite file per test.

use sessiondb::Db;
use sessiondb_sqlite::{SqliteConfig, SqliteStore, Synchronous};

fn open_default() -> (Db<SqliteStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    (Db::new(store), dir)
}

sessiondb_testkit::conformance_tests!(open_default);

/// Keeps a model case's store directory, and checks the store when the case ends: whatever the
/// random ops did, `SqliteStore::check` finds nothing wrong.
struct CheckedAtTheEnd(Db<SqliteStore>, #[allow(dead_code)] tempfile::TempDir);

impl Drop for CheckedAtTheEnd {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert_eq!(self.0.store().check().unwrap(), Vec::<String>::new());
        }
    }
}

#[test]
fn store_agrees_with_the_tree_model() {
    // NORMAL only skips the commit fsync; it keeps the model run fast and changes no semantics.
    sessiondb_testkit::model::check_against_model(
        || {
            let dir = tempfile::tempdir().unwrap();
            let config = SqliteConfig {
                synchronous: Synchronous::Normal,
                ..Default::default()
            };
            let db = Db::new(SqliteStore::open_with(dir.path(), config).unwrap());
            (db.clone(), CheckedAtTheEnd(db, dir))
        },
        std::env::var("MODEL_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(128),
    );
}

#[test]
fn attachments_round_trip_byte_exact() {
    sessiondb_testkit::cases::attachments::check_round_trips(
        || {
            let (db, dir) = open_default();
            (db.clone(), CheckedAtTheEnd(db, dir))
        },
        std::env::var("ATTACHMENT_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(48),
    );
}
