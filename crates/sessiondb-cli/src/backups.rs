//! Backups of the embedded store while `sessiondb serve` runs: one every `--backup-every`, and
//! one whenever the process receives SIGUSR1, each into a new directory of `--backup-dir` named
//! after the moment it began (`2026-12-04T13-45-00.123Z`), which opens as a store of its own.
//! After each backup only the newest `--backup-keep` complete ones stay.
//!
//! The directory belongs to one store: pruning removes every backup-named entry in it beyond the
//! newest `keep`, and incomplete ones (a backup interrupted by a crash leaves a directory
//! without a database).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use sessiondb::SqliteStore;
use sessiondb_server::App;

use crate::signals::Requests;

/// Where, how often and how many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupPlan {
    pub dir: PathBuf,
    pub every: Duration,
    pub keep: usize,
}

pub const DEFAULT_EVERY: &str = "1d";
pub const DEFAULT_KEEP: usize = 7;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct BackupStats {
    pub written: AtomicU64,
    pub failed: AtomicU64,
    /// When the newest written backup began, in Unix seconds (0 before the first).
    pub last_written_unix: AtomicU64,
}

/// `90s`, `15m`, `6h`, `1d`: a positive whole number and its unit.
pub fn parse_interval(text: &str) -> anyhow::Result<Duration> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .context("an interval needs a unit: s, m, h or d (as in `6h`)")?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .with_context(|| format!("`{text}` is not a number followed by s, m, h or d"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => bail!("`{text}`: the unit must be s, m, h or d"),
    };
    if number == 0 {
        bail!("`{text}`: the interval must be longer than zero");
    }
    Ok(Duration::from_secs(number.saturating_mul(seconds)))
}

/// The backup loop of a running server.
pub struct Schedule {
    pub plan: BackupPlan,
    pub stats: Arc<BackupStats>,
    pub requests: Requests,
}

impl Schedule {
    /// Takes backups until the runtime stops (one in progress is finished first: the runtime
    /// waits for its blocking thread, which holds the store open until then).
    pub async fn run(mut self, app: Arc<App<SqliteStore>>) {
        let every = self.plan.every;
        let mut ticker = tokio::time::interval_at((Instant::now() + every).into(), every);
        // A backup that outlasts the interval delays the next one rather than starting a burst.
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = self.requests.next() => {}
            }
            let (app, plan) = (app.clone(), self.plan.clone());
            let began = SystemTime::now();
            let outcome = tokio::task::spawn_blocking(move || take(app.db.store(), &plan, began))
                .await
                .unwrap_or_else(|panic| Err(anyhow::anyhow!("the backup panicked: {panic}")));
            match outcome {
                Ok(written) => {
                    let unix = began.duration_since(UNIX_EPOCH).unwrap_or_default();
                    self.stats.written.fetch_add(1, Relaxed);
                    self.stats.last_written_unix.store(unix.as_secs(), Relaxed);
                    tracing::info!(path = %written.display(), "backup written");
                }
                Err(error) => {
                    self.stats.failed.fetch_add(1, Relaxed);
                    tracing::error!("backup failed: {error:#}");
                }
            }
        }
    }
}

/// One backup into a new directory named for `began`, then the pruning.
fn take(store: &SqliteStore, plan: &BackupPlan, began: SystemTime) -> anyhow::Result<PathBuf> {
    let name = stamp(began);
    let written = store
        .backup(plan.dir.join(&name))
        .with_context(|| format!("backing up into {}", plan.dir.display()))?;
    if let Err(error) = prune(&plan.dir, plan.keep, &name) {
        tracing::warn!("removing old backups: {error:#}");
    }
    Ok(written)
}

/// Removes backup directories of `dir` other than the newest `keep` complete ones, and
/// incomplete ones older than `newest` (the one just written); entries not named like a
/// backup are never touched.
fn prune(dir: &Path, keep: usize, newest: &str) -> anyhow::Result<()> {
    let mut backups = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if is_stamp(&name) && entry.file_type()?.is_dir() {
            let complete = entry.path().join(sessiondb::DATABASE_FILE).exists();
            backups.push((name, complete));
        }
    }
    // Names sort by time.
    backups.sort_unstable_by(|a, b| b.0.cmp(&a.0));
    let mut kept = 0;
    for (name, complete) in backups {
        let doomed = if complete {
            kept += 1;
            kept > keep
        } else {
            name.as_str() < newest
        };
        if doomed {
            let path = dir.join(&name);
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("removing {}", path.display()))?;
            tracing::info!(path = %path.display(), "old backup removed");
        }
    }
    Ok(())
}

const STAMP_SHAPE: &[u8] = b"0000-00-00T00-00-00.000Z";

/// `2026-12-04T13-45-00.123Z` (UTC; no colons, so the name is valid everywhere, and names
/// sort by time).
fn stamp(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs();
    let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
    let of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}-{:02}-{:02}.{:03}Z",
        of_day / 3_600,
        of_day / 60 % 60,
        of_day % 60,
        since.subsec_millis()
    )
}

fn is_stamp(name: &str) -> bool {
    name.len() == STAMP_SHAPE.len()
        && name.bytes().zip(STAMP_SHAPE).all(|(b, &shape)| {
            if shape == b'0' {
                b.is_ascii_digit()
            } else {
                b == shape
            }
        })
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_need_a_positive_number_and_a_unit() {
        assert_eq!(parse_interval("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_interval("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_interval("6h").unwrap(), Duration::from_secs(21_600));
        assert_eq!(parse_interval("1d").unwrap(), Duration::from_secs(86_400));
        for bad in [
            "",
            "6",
            "h",
            "0h",
            "6 h",
            "-1h",
            "1.5h",
            "6w",
            "99999999999999999999s",
        ] {
            assert!(parse_interval(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn stamps_are_utc_dates_that_sort_by_time() {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(stamp(at(0)), "1970-01-01T00-00-00.000Z");
        // 2026-12-04T13:45:00.123Z and the last millisecond of a leap day.
        assert_eq!(stamp(at(1_796_391_900_123)), "2026-12-04T13-45-00.123Z");
        assert_eq!(stamp(at(951_868_799_999)), "2000-02-29T23-59-59.999Z");
        assert!(stamp(at(1_796_391_900_123)) < stamp(at(1_796_391_900_124)));
        assert!(is_stamp(&stamp(at(1_796_391_900_123))));
        for other in ["2026-12-04", "2026-12-04T13:45:00.123Z", "notes.txt", ""] {
            assert!(!is_stamp(other), "{other:?}");
        }
    }

    #[test]
    fn pruning_keeps_the_newest_complete_backups_and_nothing_else_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: &str, complete: bool| {
            let path = dir.path().join(name);
            std::fs::create_dir(&path).unwrap();
            if complete {
                std::fs::write(path.join(sessiondb::DATABASE_FILE), b"db").unwrap();
            }
        };
        make("2026-12-01T00-00-00.000Z", true);
        make("2026-12-02T00-00-00.000Z", false); // interrupted
        make("2026-12-03T00-00-00.000Z", true);
        make("2026-12-04T00-00-00.000Z", true);
        make("2026-12-05T00-00-00.000Z", false); // another writer's, newer: left alone
        make("keep-me", true);
        std::fs::write(dir.path().join("README"), b"mine").unwrap();
        prune(dir.path(), 2, "2026-12-04T00-00-00.000Z").unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "2026-12-03T00-00-00.000Z",
                "2026-12-04T00-00-00.000Z",
                "2026-12-05T00-00-00.000Z",
                "README",
                "keep-me"
            ]
        );
    }
}
