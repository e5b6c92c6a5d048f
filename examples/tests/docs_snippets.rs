//! Every ```rust block in docs/embedding.md is a region of a compiled, tested example: the line
//! before the block names it (`<!-- snippet: examples/<file>.rs#<name> -->`) and the example
//! marks it with `// ANCHOR: <name>` … `// ANCHOR_END: <name>`. `HPP_BLESS=1` rewrites the blocks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::path::{Path, PathBuf};

const DOC: &str = "docs/embedding.md";
const MARKER: &str = "<!-- snippet: ";
const BLESS_HINT: &str = "HPP_BLESS=1 cargo test -p hpp-examples --test docs_snippets";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The lines between the anchors, without other anchor lines, with common indentation removed.
fn region(file: &str, name: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(repo_root().join(file)).map_err(|e| format!("{file}: {e}"))?;
    let (start, end) = (format!("// ANCHOR: {name}"), format!("// ANCHOR_END: {name}"));
    let mut inside = false;
    let mut found = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t == start {
            inside = true;
            found = true;
            continue;
        }
        if t == end {
            inside = false;
            continue;
        }
        if inside && !t.starts_with("// ANCHOR") {
            lines.push(line.to_owned());
        }
    }
    if !found {
        return Err(format!("{file} has no `{start}`"));
    }
    if inside {
        return Err(format!("{file}: `{start}` has no `{end}`"));
    }
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    Ok(lines
        .into_iter()
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else {
                l[indent..].to_owned()
            }
        })
        .collect())
}

#[test]
fn every_rust_block_is_a_compiled_example_region() {
    let path = repo_root().join(DOC);
    let doc = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = doc.lines().collect();
    let mut out: Vec<String> = Vec::new();
    let mut problems = Vec::new();
    let mut stale = Vec::new();
    let mut blocks = 0;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        out.push(line.to_owned());
        i += 1;
        if line.trim() != "```rust" {
            continue;
        }
        blocks += 1;
        let marker = out
            .iter()
            .rev()
            .skip(1)
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix(MARKER))
            .and_then(|l| l.strip_suffix("-->"))
            .map(str::trim)
            .map(str::to_owned);
        let mut body = Vec::new();
        while i < lines.len() && lines[i].trim() != "```" {
            body.push(lines[i].to_owned());
            i += 1;
        }
        let Some(marker) = marker else {
            problems.push(format!(
                "{DOC} line {}: a ```rust block without a `{MARKER}examples/<file>.rs#<anchor> -->` line before it",
                out.len()
            ));
            out.extend(body);
            continue;
        };
        let Some((file, name)) = marker.split_once('#') else {
            problems.push(format!("{DOC}: malformed snippet marker {marker:?}"));
            out.extend(body);
            continue;
        };
        if !file.starts_with("examples/") {
            problems.push(format!("{DOC}: snippet {marker:?} must come from examples/"));
        }
        match region(file, name) {
            Ok(expected) => {
                if expected != body {
                    stale.push(marker.clone());
                }
                out.extend(expected);
            }
            Err(e) => {
                problems.push(format!("{DOC}: snippet {marker:?}: {e}"));
                out.extend(body);
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        blocks >= 5,
        "{DOC} should show the examples; found {blocks} rust blocks"
    );
    if stale.is_empty() {
        return;
    }
    if std::env::var_os("HPP_BLESS").is_some() {
        let mut text = out.join("\n");
        text.push('\n');
        std::fs::write(&path, text).unwrap();
        return;
    }
    panic!(
        "{DOC} is stale: the snippets {stale:?} differ from their example regions. Run `{BLESS_HINT}` and review the diff."
    );
}

#[test]
fn region_extraction_strips_anchors_and_indentation() {
    let lines = region("examples/embed_csi_driver.rs", "serve").unwrap();
    assert!(lines.first().unwrap().starts_with("let endpoint"), "{lines:?}");
    assert!(lines.iter().all(|l| !l.contains("ANCHOR")));
    assert!(region("examples/embed_csi_driver.rs", "no_such_anchor").is_err());
}
