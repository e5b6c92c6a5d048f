//! Directory names from a template such as `{namespace}-{claim}-{pv}`, which can never point
//! outside the base directory.
//!
//! Placeholders: `{namespace}`, `{claim}`, `{pv}`, `{label:<key>}`, `{annotation:<key>}`.
//! Every substituted value is sanitised (only `[A-Za-z0-9._-]` survive, others become `_`; a
//! leading `.` becomes `_`; at most [`MAX_VALUE_LEN`] bytes). Literal text may contain `/` to
//! build sub-directories. The result is then checked as a whole: relative, no `.`/`..`/empty
//! component, no NUL, bounded length. `{pv}` is mandatory so two claims never share a directory.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::config::ARCHIVE_PREFIX;

/// Longest substituted value kept (longer values are cut; `{pv}` keeps names unique), chosen
/// so `{namespace}-{claim}-{pv}` always fits in one component.
pub const MAX_VALUE_LEN: usize = 100;
/// Longest path component accepted (the usual `NAME_MAX`).
pub const MAX_COMPONENT_LEN: usize = 255;
/// Longest relative path accepted.
pub const MAX_PATH_LEN: usize = 1024;

/// What a template can refer to.
#[derive(Clone, Debug, Default)]
pub struct TemplateInput<'a> {
    /// Namespace of the claim.
    pub namespace: &'a str,
    /// Name of the claim.
    pub claim: &'a str,
    /// Name of the PV being created.
    pub pv: &'a str,
    /// Labels of the claim.
    pub labels: Option<&'a BTreeMap<String, String>>,
    /// Annotations of the claim.
    pub annotations: Option<&'a BTreeMap<String, String>>,
}

/// Why a template did not give a usable directory name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// `{` without `}`, a stray `}`, or an unknown placeholder.
    #[error("malformed template: {0}")]
    Malformed(String),
    /// The template lacks `{pv}`, so two claims could share a directory.
    #[error("template must contain {{pv}} so that every volume gets its own directory")]
    MissingPv,
    /// A label or annotation the template names is not on the claim.
    #[error("claim has no {kind} {key:?} required by the directory template")]
    MissingKey {
        /// `label` or `annotation`.
        kind: &'static str,
        /// The missing key.
        key: String,
    },
    /// The rendered path would leave the base directory or is otherwise unusable.
    #[error("rendered directory {path:?} is unsafe: {reason}")]
    Unsafe {
        /// The rendered path (lossy).
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Makes one substituted value safe to place inside a path component.
pub fn sanitize_value(value: &str) -> String {
    let mut out: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with('.') {
        out.replace_range(0..1, "_");
    }
    out.truncate(MAX_VALUE_LEN);
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// Renders `template` for one claim into a path relative to the base directory.
pub fn render(template: &str, input: &TemplateInput<'_>) -> Result<PathBuf, TemplateError> {
    let mut out = String::new();
    let mut rest = template;
    let mut saw_pv = false;
    while let Some(pos) = rest.find(['{', '}']) {
        out.push_str(&rest[..pos]);
        if rest[pos..].starts_with('}') {
            return Err(TemplateError::Malformed("unmatched '}'".into()));
        }
        let after = &rest[pos + 1..];
        let end = after
            .find('}')
            .ok_or_else(|| TemplateError::Malformed("unterminated '{'".into()))?;
        let name = &after[..end];
        if name == "pv" {
            saw_pv = true;
        }
        out.push_str(&sanitize_value(lookup(name, input)?));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    if !saw_pv {
        return Err(TemplateError::MissingPv);
    }
    validate_relative(&out)?;
    Ok(PathBuf::from(out))
}

fn lookup<'a>(name: &str, input: &TemplateInput<'a>) -> Result<&'a str, TemplateError> {
    let from_map = |kind: &'static str, map: Option<&'a BTreeMap<String, String>>, key: &str| {
        map.and_then(|m| m.get(key))
            .map(String::as_str)
            .ok_or_else(|| TemplateError::MissingKey {
                kind,
                key: key.to_owned(),
            })
    };
    match name {
        "namespace" => Ok(input.namespace),
        "claim" => Ok(input.claim),
        "pv" => Ok(input.pv),
        _ => {
            if let Some(key) = name.strip_prefix("label:") {
                from_map("label", input.labels, key)
            } else if let Some(key) = name.strip_prefix("annotation:") {
                from_map("annotation", input.annotations, key)
            } else {
                Err(TemplateError::Malformed(format!("unknown placeholder {{{name}}}")))
            }
        }
    }
}

/// Checks a rendered relative path: the last line of defence against leaving the base dir.
pub fn validate_relative(path: &str) -> Result<(), TemplateError> {
    let unsafe_path = |reason| {
        Err(TemplateError::Unsafe {
            path: path.chars().take(200).collect(),
            reason,
        })
    };
    if path.is_empty() {
        return unsafe_path("empty");
    }
    if path.contains('\0') {
        return unsafe_path("contains NUL");
    }
    if path.starts_with('/') {
        return unsafe_path("absolute");
    }
    if path.len() > MAX_PATH_LEN {
        return unsafe_path("too long");
    }
    let mut last = "";
    for component in path.split('/') {
        match component {
            "" => return unsafe_path("empty component"),
            "." | ".." => return unsafe_path("contains . or .."),
            c if c.len() > MAX_COMPONENT_LEN => return unsafe_path("component too long"),
            c => last = c,
        }
    }
    if last.starts_with(ARCHIVE_PREFIX) {
        return unsafe_path("collides with the archive prefix");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(ns: &'a str, claim: &'a str, labels: Option<&'a BTreeMap<String, String>>) -> TemplateInput<'a> {
        TemplateInput {
            namespace: ns,
            claim,
            pv: "pvc-1234",
            labels,
            annotations: labels,
        }
    }

    #[test]
    fn classic_templates() {
        let i = input("ns", "data", None);
        assert_eq!(render("{pv}", &i).unwrap(), PathBuf::from("pvc-1234"));
        assert_eq!(render("{claim}-{pv}", &i).unwrap(), PathBuf::from("data-pvc-1234"));
        assert_eq!(
            render("{namespace}-{claim}-{pv}", &i).unwrap(),
            PathBuf::from("ns-data-pvc-1234")
        );
        assert_eq!(
            render("{namespace}/{claim}-{pv}", &i).unwrap(),
            PathBuf::from("ns/data-pvc-1234")
        );
    }

    #[test]
    fn labels_and_annotations() {
        let mut m = BTreeMap::new();
        m.insert("team".to_owned(), "db/../../etc".to_owned());
        let i = input("ns", "data", Some(&m));
        assert_eq!(
            render("{label:team}/{pv}", &i).unwrap(),
            PathBuf::from("db_.._.._etc/pvc-1234")
        );
        assert_eq!(
            render("{annotation:team}-{pv}", &i).unwrap(),
            PathBuf::from("db_.._.._etc-pvc-1234")
        );
        assert_eq!(
            render("{label:missing}-{pv}", &i),
            Err(TemplateError::MissingKey {
                kind: "label",
                key: "missing".into()
            })
        );
    }

    #[test]
    fn traversal_attempts_stay_inside() {
        let cases = [
            "..",
            "../..",
            "../../etc/passwd",
            "/etc",
            "%2e%2e",
            "%2e%2e%2f",
            ".hidden",
            ".",
            "a\0b",
            "~root",
        ];
        for evil in cases {
            let i = input(evil, evil, None);
            let out = render("{namespace}/{claim}-{pv}", &i).unwrap();
            let s = out.to_str().unwrap();
            assert!(!s.starts_with('/'), "{evil}: {s}");
            assert!(!s.contains('\0'));
            assert!(
                out.components().all(|c| matches!(c, std::path::Component::Normal(_))),
                "{evil}: {s}"
            );
            let first = s.split('/').next().unwrap();
            assert!(!first.starts_with('.'), "{evil}: {s}");
        }
        assert_eq!(sanitize_value(".."), "_.");
        assert_eq!(sanitize_value("%2e%2e"), "_2e_2e");
        assert_eq!(sanitize_value("/abs"), "_abs");
        assert_eq!(sanitize_value(""), "_");
        assert_eq!(sanitize_value("ünï"), "_n_");
    }

    #[test]
    fn hostile_literals_are_rejected() {
        let i = input("ns", "c", None);
        for t in [
            "/{pv}",
            "../{pv}",
            "a/../{pv}",
            "a//{pv}",
            "./{pv}",
            "{pv}/..",
            "a\0/{pv}",
            "archived-{pv}",
        ] {
            assert!(matches!(render(t, &i), Err(TemplateError::Unsafe { .. })), "{t:?}");
        }
    }

    #[test]
    fn malformed_and_missing_pv() {
        let i = input("ns", "c", None);
        assert_eq!(render("{claim}", &i), Err(TemplateError::MissingPv));
        assert!(matches!(render("{pv", &i), Err(TemplateError::Malformed(_))));
        assert!(matches!(render("{pv}}", &i), Err(TemplateError::Malformed(_))));
        assert!(matches!(render("{uid}-{pv}", &i), Err(TemplateError::Malformed(_))));
    }

    #[test]
    fn very_long_values_are_bounded() {
        let long = "x".repeat(10_000);
        let i = input(&long, &long, None);
        let out = render("{namespace}-{claim}-{pv}", &i).unwrap();
        assert!(out.to_str().unwrap().len() <= MAX_COMPONENT_LEN);
        let too_many = "{namespace}/".repeat(20) + "{pv}";
        assert!(matches!(
            render(&too_many, &i),
            Err(TemplateError::Unsafe { reason: "too long", .. })
        ));
        let wide = "{namespace}{claim}{namespace}{pv}";
        assert!(matches!(
            render(wide, &i),
            Err(TemplateError::Unsafe {
                reason: "component too long",
                ..
            })
        ));
    }
}
