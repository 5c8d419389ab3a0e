//! Attachment payloads, their references, garbage collection and reads.

use std::collections::BTreeSet;

use rusqlite::{Connection, OptionalExtension, params};
use sessiondb_core::attachments::{ATTACHMENT_CHUNK_BYTES, Payload, Reference};
use sessiondb_core::{SessionKey, StoreError};

use crate::backend_error;

type Result<T> = std::result::Result<T, StoreError>;

/// Stores payloads the namespace does not hold yet (chunks, then the meta row).
pub(crate) fn put(conn: &Connection, namespace: &str, payloads: &[Payload]) -> Result<()> {
    for payload in payloads {
        let exists = conn
            .prepare_cached("SELECT 1 FROM attachments WHERE namespace = ?1 AND hash = ?2")
            .and_then(|mut s| s.exists(params![namespace, payload.hash]))
            .map_err(backend_error)?;
        if exists {
            continue;
        }
        let chunks = payload.bytes.chunks(ATTACHMENT_CHUNK_BYTES);
        let count = chunks.len();
        for (idx, chunk) in chunks.enumerate() {
            conn.prepare_cached(
                "INSERT INTO attachment_chunks (namespace, hash, idx, data) VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| s.execute(params![namespace, payload.hash, idx as i64, chunk]))
            .map_err(backend_error)?;
        }
        conn.prepare_cached(
            "INSERT INTO attachments (namespace, hash, media_type, bytes, chunks)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut s| {
            s.execute(params![
                namespace,
                payload.hash,
                payload.media_type,
                payload.bytes.len() as i64,
                count as i64
            ])
        })
        .map_err(backend_error)?;
    }
    Ok(())
}

fn add_ref(conn: &Connection, key: &SessionKey, message_id: &str, hash: &str) -> Result<()> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO attachment_refs (namespace, session_id, message_id, hash)
         VALUES (?1, ?2, ?3, ?4)",
    )
    .and_then(|mut s| s.execute(params![key.namespace, key.session_id, message_id, hash]))
    .map_err(backend_error)?;
    Ok(())
}

/// Records a new message's references.
pub(crate) fn add_refs(
    conn: &Connection,
    key: &SessionKey,
    message_id: &str,
    references: &[Reference],
) -> Result<()> {
    references
        .iter()
        .try_for_each(|r| add_ref(conn, key, message_id, &r.hash))
}

fn refs_of(conn: &Connection, key: &SessionKey, message_id: &str) -> Result<Vec<String>> {
    conn.prepare_cached(
        "SELECT hash FROM attachment_refs
          WHERE namespace = ?1 AND session_id = ?2 AND message_id = ?3",
    )
    .and_then(|mut s| {
        s.query_map(params![key.namespace, key.session_id, message_id], |r| {
            r.get(0)
        })?
        .collect()
    })
    .map_err(backend_error)
}

/// Makes a rewritten message's references exactly `references`, collecting what it dropped.
pub(crate) fn replace_refs(
    conn: &Connection,
    key: &SessionKey,
    message_id: &str,
    references: &[Reference],
) -> Result<()> {
    let old = refs_of(conn, key, message_id)?;
    let mut dropped = Vec::new();
    for hash in &old {
        if !references.iter().any(|r| &r.hash == hash) {
            conn.prepare_cached(
                "DELETE FROM attachment_refs
                  WHERE namespace = ?1 AND session_id = ?2 AND message_id = ?3 AND hash = ?4",
            )
            .and_then(|mut s| s.execute(params![key.namespace, key.session_id, message_id, hash]))
            .map_err(backend_error)?;
            dropped.push(hash.clone());
        }
    }
    for reference in references.iter().filter(|r| !old.contains(&r.hash)) {
        add_ref(conn, key, message_id, &reference.hash)?;
    }
    collect(conn, &key.namespace, dropped)
}

/// Drops the references of deleted messages and collects what they held alone.
pub(crate) fn drop_message_refs(conn: &Connection, key: &SessionKey, ids: &[&str]) -> Result<()> {
    let mut hashes = Vec::new();
    for id in ids {
        let held = refs_of(conn, key, id)?;
        if held.is_empty() {
            continue;
        }
        conn.prepare_cached(
            "DELETE FROM attachment_refs
              WHERE namespace = ?1 AND session_id = ?2 AND message_id = ?3",
        )
        .and_then(|mut s| s.execute(params![key.namespace, key.session_id, id]))
        .map_err(backend_error)?;
        hashes.extend(held);
    }
    collect(conn, &key.namespace, hashes)
}

/// Drops every reference of a session (clear, delete) and collects what it held alone.
pub(crate) fn drop_session_refs(conn: &Connection, key: &SessionKey) -> Result<()> {
    let hashes: Vec<String> = conn
        .prepare_cached(
            "SELECT DISTINCT hash FROM attachment_refs WHERE namespace = ?1 AND session_id = ?2",
        )
        .and_then(|mut s| {
            s.query_map(params![key.namespace, key.session_id], |r| r.get(0))?
                .collect()
        })
        .map_err(backend_error)?;
    if hashes.is_empty() {
        return Ok(());
    }
    conn.prepare_cached("DELETE FROM attachment_refs WHERE namespace = ?1 AND session_id = ?2")
        .and_then(|mut s| s.execute(params![key.namespace, key.session_id]))
        .map_err(backend_error)?;
    collect(conn, &key.namespace, hashes)
}

/// Deletes each payload no reference in the namespace points to any more.
fn collect(conn: &Connection, namespace: &str, hashes: Vec<String>) -> Result<()> {
    let unique: BTreeSet<String> = hashes.into_iter().collect();
    for hash in unique {
        let referenced = conn
            .prepare_cached(
                "SELECT 1 FROM attachment_refs WHERE namespace = ?1 AND hash = ?2 LIMIT 1",
            )
            .and_then(|mut s| s.exists(params![namespace, hash]))
            .map_err(backend_error)?;
        if referenced {
            continue;
        }
        for table in ["attachment_chunks", "attachments"] {
            conn.prepare_cached(&format!(
                "DELETE FROM {table} WHERE namespace = ?1 AND hash = ?2"
            ))
            .and_then(|mut s| s.execute(params![namespace, hash]))
            .map_err(backend_error)?;
        }
    }
    Ok(())
}

/// Decoded sizes of the payloads the namespace holds among `hashes`.
pub(crate) fn sizes(
    conn: &Connection,
    namespace: &str,
    hashes: &[String],
) -> Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for hash in hashes {
        let bytes: Option<i64> = conn
            .prepare_cached("SELECT bytes FROM attachments WHERE namespace = ?1 AND hash = ?2")
            .and_then(|mut s| {
                s.query_row(params![namespace, hash], |r| r.get(0))
                    .optional()
            })
            .map_err(backend_error)?;
        if let Some(bytes) = bytes {
            out.push((hash.clone(), bytes as u64));
        }
    }
    Ok(out)
}

/// The payloads the namespace holds among `hashes`, reassembled.
pub(crate) fn read(conn: &Connection, namespace: &str, hashes: &[String]) -> Result<Vec<Payload>> {
    let mut out = Vec::new();
    for hash in hashes {
        let meta: Option<(String, i64)> = conn
            .prepare_cached(
                "SELECT media_type, bytes FROM attachments WHERE namespace = ?1 AND hash = ?2",
            )
            .and_then(|mut s| {
                s.query_row(params![namespace, hash], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(backend_error)?;
        let Some((media_type, size)) = meta else {
            continue;
        };
        let mut bytes = Vec::with_capacity(size as usize);
        let mut stmt = conn
            .prepare_cached(
                "SELECT data FROM attachment_chunks WHERE namespace = ?1 AND hash = ?2 ORDER BY idx",
            )
            .map_err(backend_error)?;
        let mut rows = stmt
            .query(params![namespace, hash])
            .map_err(backend_error)?;
        while let Some(row) = rows.next().map_err(backend_error)? {
            let chunk = row.get_ref(0).map_err(backend_error)?;
            let blob = chunk
                .as_blob()
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            bytes.extend_from_slice(blob);
        }
        out.push(Payload::reassembled(hash, media_type, bytes, size)?);
    }
    Ok(out)
}
