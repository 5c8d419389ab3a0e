//! What a store's check (`sessiondb check`) reports, in words, whichever backend found it: each
//! backend counts the rows breaking every [`RowCheck`] and reads every session's
//! [`SessionFacts`] with queries of its own, in one snapshot.

/// An invariant a check counts the rows breaking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowCheck {
    /// Every message row has its session's row.
    MessagesWithoutSession,
    /// A row's parent link (its parent's seq) leads to the row of the id it names.
    ParentLinkMismatch,
    /// A row naming a parent the session holds links to it.
    ParentNotLinked,
    /// Every attachment reference names a stored payload.
    ReferencesWithoutPayload,
    /// Every payload has a reference and all its chunks.
    PayloadsUnreferencedOrIncomplete,
}

impl RowCheck {
    pub const ALL: [RowCheck; 5] = [
        RowCheck::MessagesWithoutSession,
        RowCheck::ParentLinkMismatch,
        RowCheck::ParentNotLinked,
        RowCheck::ReferencesWithoutPayload,
        RowCheck::PayloadsUnreferencedOrIncomplete,
    ];

    /// The problem `rows` breaking the invariant make, if any.
    pub fn problem(self, rows: i64) -> Option<String> {
        let what = match self {
            RowCheck::MessagesWithoutSession => "messages belong to no session",
            RowCheck::ParentLinkMismatch => {
                "messages link to a parent row that is not the one they name"
            }
            RowCheck::ParentNotLinked => {
                "messages name a parent in their session without linking to it"
            }
            RowCheck::ReferencesWithoutPayload => "attachment references name no stored payload",
            RowCheck::PayloadsUnreferencedOrIncomplete => {
                "attachment payloads have no reference or not all their chunks"
            }
        };
        (rows > 0).then(|| format!("{rows} {what}"))
    }
}

/// What a session row says and what its messages are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFacts {
    pub namespace: String,
    pub id: String,
    pub stored_messages: i64,
    pub next_seq: i64,
    pub leaf_id: Option<String>,
    pub leaf_seq: Option<i64>,
    /// Message rows the session holds.
    pub rows: i64,
    pub highest_seq: Option<i64>,
    /// The id of the row at the session's leaf seq.
    pub leaf_row_id: Option<String>,
}

impl SessionFacts {
    /// Adds the session's problems: counts that disagree with its rows, a seq it would give
    /// again, an active leaf that is not there.
    pub fn problems(&self, problems: &mut Vec<String>) {
        let name = match self.namespace.as_str() {
            "" => format!("session `{}`", self.id),
            namespace => format!("session `{}` of namespace `{namespace}`", self.id),
        };
        if self.stored_messages != self.rows {
            problems.push(format!(
                "{name} counts {} messages and holds {}",
                self.stored_messages, self.rows
            ));
        }
        if let Some(highest) = self.highest_seq.filter(|seq| *seq >= self.next_seq) {
            problems.push(format!(
                "{name} would give seq {} again (its highest is {highest})",
                self.next_seq
            ));
        }
        if let Some(leaf) = &self.leaf_id
            && self.leaf_row_id.as_ref() != Some(leaf)
        {
            problems.push(format!(
                "{name} has active leaf `{leaf}` at seq {:?}, where no such message is",
                self.leaf_seq
            ));
        }
    }
}
