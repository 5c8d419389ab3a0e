//! Content-addressed attachment payloads, stored once per namespace and collected when their last
//! reference goes.
//!
//! Sessions of a namespace share payloads, and their writes run concurrently (on any instance).
//! A writer that keeps a payload holds its row `FOR SHARE` until it commits, and a collector
//! takes the row `FOR UPDATE` before it counts references: so a payload is never collected
//! while a reference to it is being added, and a writer that finds it collected stores it again.
//! Hashes are visited in sorted order, so two writers never wait on each other in a cycle.

use std::collections::BTreeSet;

use deadpool_postgres::GenericClient;
use sessiondb_core::SessionKey;
use sessiondb_core::attachments::{ATTACHMENT_CHUNK_BYTES, Payload, Reference};

use crate::sql::{Param, Result, exec, get, row, rows};

/// Stores the payloads the namespace lacks and keeps the others from being collected until
/// this transaction ends.
pub(crate) async fn put<C: GenericClient>(
    c: &C,
    namespace: &str,
    payloads: &[Payload],
) -> Result<()> {
    let mut sorted: Vec<&Payload> = payloads.iter().collect();
    sorted.sort_by(|a, b| a.hash.cmp(&b.hash));
    sorted.dedup_by(|a, b| a.hash == b.hash);
    'payloads: for payload in sorted {
        let chunks = payload.bytes.chunks(ATTACHMENT_CHUNK_BYTES);
        let (size, count) = (payload.bytes.len() as i64, chunks.len() as i32);
        // Stored already (committed: the insert waits for a writer still storing it) is kept
        // by a share lock; one collected meanwhile is stored again.
        loop {
            let inserted = exec(
                c,
                "INSERT INTO attachments (namespace, hash, media_type, bytes, chunks)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[
                    &namespace,
                    &payload.hash,
                    &payload.media_type,
                    &size,
                    &count,
                ],
            )
            .await?;
            if inserted > 0 {
                break;
            }
            let kept = row(
                c,
                "SELECT 1 FROM attachments WHERE namespace = $1 AND hash = $2 FOR SHARE",
                &[&namespace, &payload.hash],
            )
            .await?;
            if kept.is_some() {
                continue 'payloads;
            }
        }
        for (idx, chunk) in chunks.enumerate() {
            exec(
                c,
                "INSERT INTO attachment_chunks (namespace, hash, idx, data) VALUES ($1, $2, $3, $4)",
                &[&namespace, &payload.hash, &(idx as i32), &chunk],
            )
            .await?;
        }
    }
    Ok(())
}

async fn add_ref<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    message_id: &str,
    hash: &str,
) -> Result<()> {
    exec(
        c,
        "INSERT INTO attachment_refs (namespace, session_id, message_id, hash)
         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        &[&key.namespace, &key.session_id, &message_id, &hash],
    )
    .await?;
    Ok(())
}

pub(crate) async fn add_refs<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    message_id: &str,
    references: &[Reference],
) -> Result<()> {
    for reference in references {
        add_ref(c, key, message_id, &reference.hash).await?;
    }
    Ok(())
}

async fn refs_of<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    message_id: &str,
) -> Result<Vec<String>> {
    rows(
        c,
        "SELECT hash FROM attachment_refs
          WHERE namespace = $1 AND session_id = $2 AND message_id = $3",
        &[&key.namespace, &key.session_id, &message_id],
    )
    .await?
    .iter()
    .map(|r| get(r, 0))
    .collect()
}

/// Makes `references` the message's references, collecting payloads no longer referenced.
pub(crate) async fn replace_refs<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    message_id: &str,
    references: &[Reference],
) -> Result<()> {
    let old = refs_of(c, key, message_id).await?;
    let mut dropped = Vec::new();
    for hash in &old {
        if !references.iter().any(|r| &r.hash == hash) {
            exec(
                c,
                "DELETE FROM attachment_refs
                  WHERE namespace = $1 AND session_id = $2 AND message_id = $3 AND hash = $4",
                &[&key.namespace, &key.session_id, &message_id, hash],
            )
            .await?;
            dropped.push(hash.clone());
        }
    }
    for reference in references.iter().filter(|r| !old.contains(&r.hash)) {
        add_ref(c, key, message_id, &reference.hash).await?;
    }
    collect(c, &key.namespace, dropped).await
}

pub(crate) async fn drop_message_refs<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    ids: &[String],
) -> Result<()> {
    drop_refs(
        c,
        &key.namespace,
        "DELETE FROM attachment_refs
          WHERE namespace = $1 AND session_id = $2 AND message_id = ANY($3)
          RETURNING hash",
        &[&key.namespace, &key.session_id, &ids],
    )
    .await
}

pub(crate) async fn drop_session_refs<C: GenericClient>(c: &C, key: &SessionKey) -> Result<()> {
    drop_refs(
        c,
        &key.namespace,
        "DELETE FROM attachment_refs WHERE namespace = $1 AND session_id = $2 RETURNING hash",
        &[&key.namespace, &key.session_id],
    )
    .await
}

/// Runs a `DELETE … RETURNING hash` of reference rows, then collects the payloads it freed.
async fn drop_refs<C: GenericClient>(
    c: &C,
    namespace: &str,
    sql: &str,
    params: &[Param<'_>],
) -> Result<()> {
    let hashes = rows(c, sql, params)
        .await?
        .iter()
        .map(|r| get(r, 0))
        .collect::<Result<_>>()?;
    collect(c, namespace, hashes).await
}

/// Deletes the payloads among `hashes` that nothing references any more.
async fn collect<C: GenericClient>(c: &C, namespace: &str, hashes: Vec<String>) -> Result<()> {
    let unique: BTreeSet<String> = hashes.into_iter().collect();
    for hash in unique {
        let locked = row(
            c,
            "SELECT 1 FROM attachments WHERE namespace = $1 AND hash = $2 FOR UPDATE",
            &[&namespace, &hash],
        )
        .await?;
        if locked.is_none() {
            continue;
        }
        let referenced = row(
            c,
            "SELECT 1 FROM attachment_refs WHERE namespace = $1 AND hash = $2 LIMIT 1",
            &[&namespace, &hash],
        )
        .await?;
        if referenced.is_some() {
            continue;
        }
        for sql in [
            "DELETE FROM attachment_chunks WHERE namespace = $1 AND hash = $2",
            "DELETE FROM attachments WHERE namespace = $1 AND hash = $2",
        ] {
            exec(c, sql, &[&namespace, &hash]).await?;
        }
    }
    Ok(())
}

pub(crate) async fn sizes<C: GenericClient>(
    c: &C,
    namespace: &str,
    hashes: &[String],
) -> Result<Vec<(String, u64)>> {
    rows(
        c,
        "SELECT hash, bytes FROM attachments WHERE namespace = $1 AND hash = ANY($2)",
        &[&namespace, &hashes],
    )
    .await?
    .iter()
    .map(|r| Ok((get(r, 0)?, get::<i64>(r, 1)? as u64)))
    .collect()
}

pub(crate) async fn read<C: GenericClient>(
    c: &C,
    namespace: &str,
    hashes: &[String],
) -> Result<Vec<Payload>> {
    let mut out = Vec::new();
    for hash in hashes {
        let Some(meta) = row(
            c,
            "SELECT media_type, bytes FROM attachments WHERE namespace = $1 AND hash = $2",
            &[&namespace, hash],
        )
        .await?
        else {
            continue;
        };
        let (media_type, size): (String, i64) = (get(&meta, 0)?, get(&meta, 1)?);
        let mut bytes = Vec::with_capacity(size as usize);
        for chunk in rows(
            c,
            "SELECT data FROM attachment_chunks WHERE namespace = $1 AND hash = $2 ORDER BY idx",
            &[&namespace, hash],
        )
        .await?
        {
            bytes.extend_from_slice(get::<&[u8]>(&chunk, 0)?);
        }
        out.push(Payload::reassembled(hash, media_type, bytes, size)?);
    }
    Ok(out)
}
