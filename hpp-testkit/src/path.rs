//! Request routing: which API endpoint a path and query address.

use std::collections::BTreeMap;

/// The endpoint a request path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/version`.
    Version,
    /// `/api`: the core group's versions.
    CoreVersions,
    /// `/apis`: every non-core group.
    Groups,
    /// `/apis/{group}`: one group.
    Group(String),
    /// `/api/v1` or `/apis/{group}/{version}`: the resources of one group version.
    Resources {
        /// API group ("" for core).
        group: String,
        /// API version.
        version: String,
    },
    /// A collection, an object or an object's subresource.
    Object(ObjectPath),
    /// Anything else.
    Unknown,
}

/// The parts of a resource path such as `/apis/apps/v1/namespaces/ns/daemonsets/x/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ObjectPath {
    /// API group ("" for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Resource plural.
    pub plural: String,
    /// Namespace from the path, if the path had one.
    pub namespace: Option<String>,
    /// Object name; `None` addresses the collection.
    pub name: Option<String>,
    /// Subresource such as `status`.
    pub subresource: Option<String>,
}

/// Splits a path into a [`Route`]; `namespaced(group, version, plural)` says whether a plural
/// names a namespaced kind, which disambiguates `/api/v1/namespaces/{x}/...`.
pub(crate) fn route(path: &str, namespaced: impl Fn(&str, &str, &str) -> bool) -> Route {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Route::Version,
        ["api"] => return Route::CoreVersions,
        ["apis"] => return Route::Groups,
        ["apis", group] => return Route::Group((*group).to_string()),
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Route::Unknown,
    };
    let (group, version) = (group.to_string(), version.to_string());
    let owned = |s: Option<&&str>| s.map(|s| (*s).to_string());
    let object = match rest {
        [] => return Route::Resources { group, version },
        ["namespaces", ns, plural, tail @ ..] if namespaced(&group, &version, plural) => {
            if tail.len() > 2 {
                return Route::Unknown;
            }
            ObjectPath {
                plural: (*plural).to_string(),
                namespace: Some((*ns).to_string()),
                name: owned(tail.first()),
                subresource: owned(tail.get(1)),
                group,
                version,
            }
        }
        [plural, tail @ ..] if tail.len() <= 2 => ObjectPath {
            plural: (*plural).to_string(),
            namespace: None,
            name: owned(tail.first()),
            subresource: owned(tail.get(1)),
            group,
            version,
        },
        _ => return Route::Unknown,
    };
    Route::Object(object)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses an `application/x-www-form-urlencoded` query string; later keys win.
pub(crate) fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(pair), String::new()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns_kinds(_g: &str, _v: &str, plural: &str) -> bool {
        matches!(plural, "pods" | "daemonsets")
    }

    #[test]
    fn routes() {
        assert_eq!(route("/version", ns_kinds), Route::Version);
        assert_eq!(route("/apis/apps", ns_kinds), Route::Group("apps".into()));
        assert_eq!(
            route("/api/v1", ns_kinds),
            Route::Resources {
                group: String::new(),
                version: "v1".into()
            }
        );
        let Route::Object(p) = route("/apis/apps/v1/namespaces/ns/daemonsets/ds/status", ns_kinds) else {
            unreachable!()
        };
        assert_eq!(
            (
                p.group.as_str(),
                p.plural.as_str(),
                p.namespace.as_deref(),
                p.name.as_deref(),
                p.subresource.as_deref()
            ),
            ("apps", "daemonsets", Some("ns"), Some("ds"), Some("status"))
        );
        let Route::Object(p) = route("/api/v1/namespaces/ns/status", ns_kinds) else {
            unreachable!()
        };
        assert_eq!(
            (p.plural.as_str(), p.name.as_deref(), p.subresource.as_deref()),
            ("namespaces", Some("ns"), Some("status"))
        );
        let Route::Object(p) = route("/api/v1/pods", ns_kinds) else {
            unreachable!()
        };
        assert_eq!((p.plural.as_str(), p.namespace, p.name), ("pods", None, None));
        assert_eq!(route("/api/v1/a/b/c/d", ns_kinds), Route::Unknown);
    }

    #[test]
    fn query() {
        let q = parse_query("labelSelector=app%3Dhpp%2Ctier+in+%28a%29&watch=true&x");
        assert_eq!(q["labelSelector"], "app=hpp,tier in (a)");
        assert_eq!(q["watch"], "true");
        assert_eq!(q["x"], "");
    }
}
