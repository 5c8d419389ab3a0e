//! The shared conformance suite and the model test, each on a throw-away PostgreSQL cluster of
//! its own.

use sessiondb::Db;
use sessiondb_postgres::cluster::TempCluster;
use sessiondb_postgres::{PgConfig, PgStore};

fn cluster() -> TempCluster {
    TempCluster::start().unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"))
}

fn connect(cluster: &TempCluster, url: &str) -> Db<PgStore> {
    let config = PgConfig {
        max_connections: 4,
        ..PgConfig::default()
    };
    let store =
        PgStore::connect_blocking(url, config).unwrap_or_else(|e| panic!("{e}\n{}", cluster.log()));
    Db::new(store)
}

fn open() -> (Db<PgStore>, TempCluster) {
    let cluster = cluster();
    (connect(&cluster, &cluster.url()), cluster)
}

/// A model case's database, checked when the case ends: whatever the random ops did,
/// `check_database` finds nothing wrong.
struct CheckedAtTheEnd(String);

impl Drop for CheckedAtTheEnd {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let problems = runtime.block_on(sessiondb_postgres::check_database(&self.0));
            assert_eq!(problems.unwrap(), Vec::<String>::new());
        }
    }
}

/// Many stores on one cluster, each in a new database copied from a migrated one (for tests
/// that open a store per case).
fn opener() -> impl Fn() -> (Db<PgStore>, CheckedAtTheEnd) {
    let cluster = cluster();
    let create = |cluster: &TempCluster, name: &str, template: &str| {
        cluster
            .create_database(name, template)
            .unwrap_or_else(|e| panic!("{e}\n{}", cluster.log()))
    };
    // A template database must have no connections while it is copied.
    drop(connect(
        &cluster,
        &create(&cluster, "migrated", "template1"),
    ));
    let cases = std::sync::atomic::AtomicUsize::new(0);
    move || {
        let case = cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let url = create(&cluster, &format!("case_{case}"), "migrated");
        (connect(&cluster, &url), CheckedAtTheEnd(url))
    }
}

sessiondb_testkit::conformance_tests!(open);

#[test]
fn store_agrees_with_the_tree_model() {
    sessiondb_testkit::model::check_against_model(
        opener(),
        std::env::var("MODEL_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(32),
    );
}

#[test]
fn attachments_round_trip_byte_exact() {
    sessiondb_testkit::cases::attachments::check_round_trips(
        opener(),
        std::env::var("ATTACHMENT_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16),
    );
}
