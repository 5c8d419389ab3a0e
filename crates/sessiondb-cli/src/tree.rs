//! Drawing a session's message tree in the terminal, from the lines of its export (the whole
//! tree in seq order, the same from the embedded store and from a server).

use std::collections::{HashMap, HashSet};
use std::io::Write;

use anyhow::Context;
use serde_json::Value;

const PREVIEW_CHARS: usize = 60;

/// What the tree shows of one message.
pub struct Node {
    id: String,
    role: String,
    preview: String,
    parent_id: Option<String>,
}

impl Node {
    /// The node of an export line, `None` for a line that is not a message (compactions, state,
    /// context).
    pub fn of_export_line(line: &str) -> anyhow::Result<Option<Node>> {
        let mut line: Value = serde_json::from_str(line).context("reading an export line")?;
        let Some(message) = line.get("message") else {
            return Ok(None);
        };
        let text = |field: &str| {
            message
                .get(field)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        Ok(Some(Node {
            id: text("id").context("an exported message without an id")?,
            role: text("role").unwrap_or_default(),
            preview: preview(message),
            parent_id: match line["parentId"].take() {
                Value::String(parent) => Some(parent),
                _ => None,
            },
        }))
    }
}

/// One line of text for a message: its text parts or string content, else its part types.
fn preview(message: &Value) -> String {
    let mut text = String::new();
    if let Some(Value::Array(parts)) = message.get("parts") {
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
    if let Some(Value::String(content)) = message.get("content") {
        text.push_str(content);
    }
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > PREVIEW_CHARS {
        let cut: String = flat.chars().take(PREVIEW_CHARS).collect();
        format!("{}…", cut.trim_end())
    } else {
        flat
    }
}

/// Prints every tree of `nodes` (in seq order), children oldest first, marking with `*` the
/// messages in `active`. A message whose parent is not among them is a root, as the store
/// treats it. Iterative, so deep trees are fine.
pub fn draw(nodes: &[Node], active: &HashSet<String>, out: &mut impl Write) -> anyhow::Result<()> {
    let position: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| (node.id.as_str(), i))
        .collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut roots = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        match node.parent_id.as_deref().and_then(|p| position.get(p)) {
            Some(&parent) => children[parent].push(i),
            None => roots.push(i),
        }
    }
    // (node, prefix for its own line, prefix for its children)
    let mut stack: Vec<(usize, String, String)> = roots
        .into_iter()
        .rev()
        .map(|root| (root, String::new(), String::new()))
        .collect();
    while let Some((i, line_prefix, child_prefix)) = stack.pop() {
        let node = &nodes[i];
        let mark = if active.contains(&node.id) { " *" } else { "" };
        writeln!(
            out,
            "{line_prefix}{} [{}] {}{mark}",
            node.id, node.role, node.preview
        )?;
        let last = children[i].len().saturating_sub(1);
        for (n, &child) in children[i].iter().enumerate().rev() {
            let (branch, next) = if n == last {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, parent: Option<&str>, text: &str) -> Node {
        let line = serde_json::json!({
            "message": {"id": id, "role": "user", "content": text},
            "parentId": parent,
            "createdAt": 1,
        });
        Node::of_export_line(&line.to_string()).unwrap().unwrap()
    }

    /// Children come oldest first (in export order, whatever order their parents came in); a
    /// message whose parent is not in the export is a root of its own, as the store treats it;
    /// lines that are not messages are no nodes.
    #[test]
    fn draws_children_in_export_order_and_orphans_as_roots() {
        let session_line = r#"{"session":{"id":"s","createdAt":1}}"#;
        assert!(Node::of_export_line(session_line).unwrap().is_none());
        let nodes = [
            node("b", Some("a"), "adopted: the parent came later"),
            node("a", None, "root"),
            node("c", Some("a"), "second child"),
            node("o", Some("gone"), "orphan"),
            node("d", Some("b"), &"long ".repeat(20)),
        ];
        let active: HashSet<String> = ["a", "c"].map(String::from).into();
        let mut out = Vec::new();
        draw(&nodes, &active, &mut out).unwrap();
        let preview = format!("{}…", "long ".repeat(12).trim_end());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(
                "a [user] root *\n\
                 ├─ b [user] adopted: the parent came later\n\
                 │  └─ d [user] {preview}\n\
                 └─ c [user] second child *\n\
                 o [user] orphan\n"
            )
        );
    }
}
