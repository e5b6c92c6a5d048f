//! Label and field selectors as the API server parses them from `labelSelector` /
//! `fieldSelector` query parameters.

use std::collections::BTreeSet;

use serde_json::Value;

/// One parsed label requirement.
#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed `labelSelector`; all requirements must hold (logical AND).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<LabelReq>,
}

/// Splits on commas that are not inside parentheses (`a in (x,y),b` has two parts).
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter().map(str::trim).filter(|p| !p.is_empty()).collect()
}

fn parse_set(rest: &str) -> Result<BTreeSet<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised value list, got {rest:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn valid_key(key: &str) -> Result<String, String> {
    let key = key.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(format!("invalid label key {key:?}"));
    }
    Ok(key.to_string())
}

fn parse_label_req(part: &str) -> Result<LabelReq, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(LabelReq::NotExists(valid_key(key)?));
    }
    if let Some((key, rest)) = part.split_once(" notin ") {
        return Ok(LabelReq::NotIn(valid_key(key)?, parse_set(rest)?));
    }
    if let Some((key, rest)) = part.split_once(" in ") {
        return Ok(LabelReq::In(valid_key(key)?, parse_set(rest)?));
    }
    if let Some((key, value)) = part.split_once("!=") {
        return Ok(LabelReq::NotEq(valid_key(key)?, value.trim().to_string()));
    }
    if let Some((key, value)) = part.split_once("==") {
        return Ok(LabelReq::Eq(valid_key(key)?, value.trim().to_string()));
    }
    if let Some((key, value)) = part.split_once('=') {
        return Ok(LabelReq::Eq(valid_key(key)?, value.trim().to_string()));
    }
    let number = |v: &str| v.trim().parse::<i64>().map_err(|e| format!("{part:?}: {e}"));
    if let Some((key, value)) = part.split_once('>') {
        return Ok(LabelReq::Gt(valid_key(key)?, number(value)?));
    }
    if let Some((key, value)) = part.split_once('<') {
        return Ok(LabelReq::Lt(valid_key(key)?, number(value)?));
    }
    Ok(LabelReq::Exists(valid_key(part)?))
}

impl LabelSelector {
    /// Parses the selector syntax of `kubectl -l` (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`).
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let reqs = split_top_level(s)
            .into_iter()
            .map(parse_label_req)
            .collect::<Result<_, _>>()?;
        Ok(Self { reqs })
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            LabelReq::NotIn(k, set) => get(k).is_none_or(|v| !set.contains(v)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::Gt(k, n) => get(k).and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
            LabelReq::Lt(k, n) => get(k).and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
        })
    }
}

/// A parsed `fieldSelector`: `path=value`, `path==value`, `path!=value`, comma separated.
///
/// Any dotted path into the object is accepted (a superset of what the real server allows per
/// kind: `metadata.name`, `metadata.namespace`, `spec.nodeName`, `status.phase`, ...). A missing
/// field compares as the empty string.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` syntax.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (path, equal, value) = if let Some((p, v)) = part.split_once("!=") {
                (p, false, v)
            } else if let Some((p, v)) = part.split_once("==") {
                (p, true, v)
            } else if let Some((p, v)) = part.split_once('=') {
                (p, true, v)
            } else {
                return Err(format!("invalid field selector {part:?}"));
            };
            reqs.push((path.trim().to_string(), equal, value.trim().to_string()));
        }
        Ok(Self { reqs })
    }

    /// Whether every `path (=|!=) value` requirement holds for `obj`.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(path, equal, value)| {
            let pointer = format!("/{}", path.replace('.', "/"));
            let actual = match obj.pointer(&pointer) {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "hpp", "tier": "csi", "n": "5"}));
        let yes = [
            "app=hpp",
            "app==hpp",
            "app!=other",
            "app in (x, hpp)",
            "tier notin (legacy)",
            "app",
            "!missing",
            "app=hpp,tier in (csi,legacy)",
            "n>4",
            "n<6",
            "",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        let no = [
            "app=x",
            "app!=hpp",
            "app in (x)",
            "tier notin (csi)",
            "missing",
            "!app",
            "n>5",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        assert!(LabelSelector::parse("app in x").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        assert!(FieldSelector::parse("metadata.name=a").unwrap().matches(&o));
        assert!(
            FieldSelector::parse("metadata.namespace==ns,spec.nodeName=n1")
                .unwrap()
                .matches(&o)
        );
        assert!(!FieldSelector::parse("metadata.name!=a").unwrap().matches(&o));
        assert!(FieldSelector::parse("status.phase=").unwrap().matches(&o));
        assert!(FieldSelector::parse("bogus").is_err());
    }
}
