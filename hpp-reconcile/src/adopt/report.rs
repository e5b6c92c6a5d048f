//! What a run found and did, per claim, and the one-line summary.

use serde::Serialize;

use super::assess::Assessment;

/// A claim's state in a dry run, or its outcome in a real one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Status {
    /// Dry run: would be adopted.
    Adoptable,
    /// An earlier run started it; the next real run finishes it.
    InProgress,
    /// Not adopted (see the refusals); nothing was changed.
    Refused,
    /// Not adopted (see the refusals); what an earlier run had done was undone.
    RolledBack,
    /// Adopted (by this run, or finished by it).
    Adopted,
    /// The old claim is being deleted and a pod still uses it; run again once it is gone.
    Waiting,
    /// Someone else changed the objects; nothing more was changed (see the message).
    Stuck,
    /// An API call failed (see the message); run again.
    Failed,
    /// The run stopped before finishing it (the step budget ran out).
    Interrupted,
}

impl Status {
    /// Every status, in the order the summary lists them.
    pub const ALL: [Status; 9] = [
        Status::Adoptable,
        Status::InProgress,
        Status::Adopted,
        Status::Refused,
        Status::RolledBack,
        Status::Waiting,
        Status::Stuck,
        Status::Failed,
        Status::Interrupted,
    ];

    /// The word in tables and the summary.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Adoptable => "Adoptable",
            Status::InProgress => "InProgress",
            Status::Refused => "Refused",
            Status::RolledBack => "RolledBack",
            Status::Adopted => "Adopted",
            Status::Waiting => "Waiting",
            Status::Stuck => "Stuck",
            Status::Failed => "Failed",
            Status::Interrupted => "Interrupted",
        }
    }

    /// Whether the claim still needs someone's attention after a real run.
    pub fn is_problem(self) -> bool {
        matches!(
            self,
            Status::Refused
                | Status::RolledBack
                | Status::Waiting
                | Status::Stuck
                | Status::Failed
                | Status::Interrupted
        )
    }
}

/// One claim.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// What was found.
    #[serde(flatten)]
    pub found: Assessment,
    /// Its state or outcome.
    pub status: Status,
    /// What happened, when the refusals do not say it (waiting, stuck, failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Row {
    /// The reasons as one line: the message, then each refusal.
    pub fn reason_text(&self) -> String {
        let mut parts: Vec<String> = self.message.iter().cloned().collect();
        parts.extend(
            self.found
                .refusals
                .iter()
                .map(|r| format!("{:?}: {}", r.reason, r.message)),
        );
        parts.join("; ")
    }
}

/// A run's rows and whether it changed anything.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Whether this was a dry run (nothing written).
    pub dry_run: bool,
    /// One row per claim, by namespace and name.
    pub claims: Vec<Row>,
    /// The summary line.
    pub summary: String,
}

impl Report {
    /// A report of `rows`, with its summary.
    pub fn new(dry_run: bool, claims: Vec<Row>) -> Self {
        let summary = summary(dry_run, &claims);
        Self {
            dry_run,
            claims,
            summary,
        }
    }

    /// Whether any claim still needs attention (a real run's exit status).
    pub fn has_problems(&self) -> bool {
        !self.dry_run && self.claims.iter().any(|r| r.status.is_problem())
    }
}

/// `adopt: 2 Adopted, 1 Refused (3 claims)`; a dry run says nothing was changed.
pub fn summary(dry_run: bool, rows: &[Row]) -> String {
    let counts: Vec<String> = Status::ALL
        .iter()
        .filter_map(|s| {
            let n = rows.iter().filter(|r| r.status == *s).count();
            (n > 0).then(|| format!("{n} {}", s.as_str()))
        })
        .collect();
    let what = if counts.is_empty() {
        "nothing to adopt".to_owned()
    } else {
        counts.join(", ")
    };
    let claims = match rows.len() {
        1 => "1 claim".to_owned(),
        n => format!("{n} claims"),
    };
    match dry_run {
        true => format!("adopt (dry run, nothing changed): {what} ({claims})"),
        false => format!("adopt: {what} ({claims})"),
    }
}
