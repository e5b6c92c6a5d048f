//! The published crates' tests read the example CRs of `deploy/examples/` from copies inside
//! their crate (a packaged crate has no `../deploy`); the copies are the same files, byte for
//! byte, and there is one for every example. `HPP_BLESS=1` refreshes them from deploy/.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const BLESS: &str = "HPP_BLESS=1 cargo test -p xtask --test deploy_example_copies";
const EXAMPLES: &str = "deploy/examples";
/// The directories holding a copy of every example CR.
const COPIES: &[&str] = &[
    "hpp-reconcile/tests/fixtures/examples",
    "hpp-bin/tests/fixtures/examples",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The YAML files of `dir`, by file name.
fn yaml_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

#[test]
fn example_copies_are_the_examples() {
    let examples = yaml_files(&repo().join(EXAMPLES));
    assert!(examples.len() >= 4, "{EXAMPLES}: {:?}", examples.keys());
    let mut stale = Vec::new();
    for copies in COPIES {
        let dir = repo().join(copies);
        if std::env::var_os("HPP_BLESS").is_some() {
            for name in yaml_files(&dir).keys().filter(|n| !examples.contains_key(*n)) {
                std::fs::remove_file(dir.join(name)).unwrap();
            }
            for (name, text) in &examples {
                std::fs::write(dir.join(name), text).unwrap();
            }
        }
        let copied = yaml_files(&dir);
        let names: BTreeSet<&String> = examples.keys().chain(copied.keys()).collect();
        for name in names {
            match (examples.get(name), copied.get(name)) {
                (Some(a), Some(b)) if a == b => {}
                (Some(_), Some(_)) => stale.push(format!("{copies}/{name} differs from {EXAMPLES}/{name}")),
                (Some(_), None) => stale.push(format!("{copies}/{name} is missing")),
                (None, _) => stale.push(format!("{copies}/{name} has no original in {EXAMPLES}")),
            }
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:#?}\nthe copies must equal deploy/examples; refresh them with: {BLESS}"
    );
}
