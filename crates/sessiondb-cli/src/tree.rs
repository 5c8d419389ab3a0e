//! Drawing a session's message tree in the terminal.

use std::collections::HashSet;
use std::io::Write;

use serde_json::Value;
use sessiondb::{Session, SqliteStore, StoredMessage};

const PREVIEW_CHARS: usize = 60;

/// One line of text for a message: its text parts or string content, else its part types.
fn preview(message: &StoredMessage) -> String {
    let value = message.to_value();
    let mut text = String::new();
    if let Some(Value::Array(parts)) = value.get("parts") {
        for part in parts {
            match part.get("text").and_then(Value::as_str) {
                Some(t) if part.get("type").and_then(Value::as_str) == Some("text") => {
                    text.push_str(t);
                    text.push(' ');
                }
                _ => {
                    let kind = part.get("type").and_then(Value::as_str).unwrap_or("?");
                    text.push_str(&format!("<{kind}> "));
                }
            }
        }
    }
    if let Some(Value::String(content)) = value.get("content") {
        text.push_str(content);
    }
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > PREVIEW_CHARS {
        format!("{}…", flat.chars().take(PREVIEW_CHARS).collect::<String>())
    } else {
        flat
    }
}

/// Prints every tree of the session, children oldest first. Iterative, so deep trees are fine.
pub async fn draw(session: &Session<SqliteStore>, out: &mut impl Write) -> anyhow::Result<()> {
    let active: HashSet<String> = session
        .row_stats(None)
        .await?
        .into_iter()
        .map(|r| r.id)
        .collect();
    // (message, prefix for its own line, prefix for its children)
    let mut stack: Vec<(StoredMessage, String, String)> = Vec::new();
    for root in session.roots().await?.into_iter().rev() {
        stack.push((root, String::new(), String::new()));
    }
    while let Some((message, line_prefix, child_prefix)) = stack.pop() {
        let mark = if active.contains(message.id.as_str()) {
            " *"
        } else {
            ""
        };
        writeln!(
            out,
            "{line_prefix}{} [{}] {}{mark}",
            message.id,
            message.role,
            preview(&message)
        )?;
        let children = session.branches(&message.id).await?;
        let last = children.len().saturating_sub(1);
        for (i, child) in children.into_iter().enumerate().rev() {
            let (branch, next) = if i == last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            stack.push((
                child,
                format!("{child_prefix}{branch}"),
                format!("{child_prefix}{next}"),
            ));
        }
    }
    Ok(())
}
