//! The API verbs on the store, with the real server's semantics: create, update (optimistic
//! concurrency), the patch flavours, server-side apply, delete with finalizers, and the
//! `/status` split.

use serde_json::{Value, json};

use super::error::ApiError;
use super::immutable;
use super::kinds::KindInfo;
use super::patch;
use super::ssa;
use super::store::{ObjKey, Propagation, State, has_finalizers, meta_str, now, remove_meta, set_meta};

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// The main resource: `.status` changes are ignored for kinds with a status subresource.
    Main,
    /// The `/status` subresource: everything but `.status` is ignored.
    Status,
    /// Test-kit direct write: everything is taken as given.
    All,
}

/// A patch body by content type.
#[derive(Debug, Clone)]
pub(crate) enum PatchBody {
    Merge(Value),
    Strategic(Value),
    Json(json_patch::Patch),
    Apply {
        config: Value,
        manager: String,
        force: bool,
    },
}

/// Outcome of a DELETE.
#[derive(Debug, Clone)]
pub(crate) enum Deleted {
    /// Removed now; the last state of the object.
    Gone(Value),
    /// Held by finalizers; the object with `deletionTimestamp` set.
    Pending(Value),
}

fn spec_view(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Value::Object(m) = &mut v {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

fn finalizers(obj: &Value) -> Vec<Value> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

impl State {
    /// Sets `apiVersion`/`kind` and drops server-owned metadata a client must not set.
    fn normalise(kind: &KindInfo, obj: &mut Value) {
        obj["apiVersion"] = json!(kind.ar.api_version);
        obj["kind"] = json!(kind.ar.kind);
        remove_meta(obj, "managedFields");
        if !kind.namespaced {
            remove_meta(obj, "namespace");
        }
    }

    /// POST: create a new object. `Part::All` keeps `.status` (used by `seed`).
    pub(crate) fn create(
        &mut self,
        kind: &KindInfo,
        namespace: Option<&str>,
        mut obj: Value,
        part: Part,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        let body_ns = meta_str(&obj, "namespace").map(str::to_string);
        let namespace = match (kind.namespaced, namespace, body_ns.as_deref()) {
            (false, ..) => None,
            (true, Some(path), Some(body)) if path != body => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            (true, Some(ns), _) | (true, None, Some(ns)) => Some(ns.to_string()),
            (true, None, None) => return Err(ApiError::bad_request("a namespace is required")),
        };
        let name = match (meta_str(&obj, "name"), meta_str(&obj, "generateName")) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{}", self.next_suffix()),
            _ => {
                return Err(ApiError::invalid(
                    kind,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        };
        let key = ObjKey::new(kind, namespace.as_deref(), &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(kind, &name));
        }
        if part != Part::All && meta_str(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        Self::normalise(kind, &mut obj);
        if kind.status
            && part != Part::All
            && let Value::Object(m) = &mut obj
        {
            m.remove("status");
        }
        set_meta(&mut obj, "name", json!(name));
        if let Some(ns) = &namespace {
            set_meta(&mut obj, "namespace", json!(ns));
        }
        let uid = self.next_uid();
        set_meta(&mut obj, "uid", json!(uid));
        set_meta(&mut obj, "generation", json!(1));
        remove_meta(&mut obj, "resourceVersion");
        // Seeding may backdate an object or start it out deleting (held by its finalizers).
        let seeded = part == Part::All;
        if !(seeded && meta_str(&obj, "creationTimestamp").is_some()) {
            set_meta(&mut obj, "creationTimestamp", json!(now()));
        }
        if !(seeded && has_finalizers(&obj)) {
            remove_meta(&mut obj, "deletionTimestamp");
            remove_meta(&mut obj, "deletionGracePeriodSeconds");
        }
        if self.protect_claims {
            super::protection::admit(&key, &mut obj);
        }
        if dry_run {
            return Ok(obj);
        }
        Ok(self.commit(&key, obj))
    }

    /// The stored object, presented in the requested kind's version.
    pub(crate) fn get(&self, kind: &KindInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        let key = ObjKey::new(kind, namespace, name);
        self.objects
            .get(&key)
            .map(|o| present(kind, o))
            .ok_or_else(|| ApiError::not_found(kind, name))
    }

    /// Every update path ends here: applies `mutate` to a copy of the stored object, enforces
    /// the part split, immutable metadata, the resourceVersion precondition and the
    /// finalizer rules, bumps `generation` on spec changes and commits.
    pub(crate) fn update(
        &mut self,
        kind: &KindInfo,
        namespace: Option<&str>,
        name: &str,
        part: Part,
        dry_run: bool,
        mutate: impl FnOnce(&mut Value) -> Result<(), ApiError>,
    ) -> Result<Value, ApiError> {
        let key = ObjKey::new(kind, namespace, name);
        let old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        let mut candidate = old.clone();
        mutate(&mut candidate)?;
        if !candidate.is_object() {
            return Err(ApiError::bad_request("the patched object must be a JSON object"));
        }
        if let Some(rv) = meta_str(&candidate, "resourceVersion")
            && !rv.is_empty()
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::stale(kind, name));
        }
        if meta_str(&candidate, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&candidate, "name").unwrap_or_default()
            )));
        }
        let mut new = match part {
            Part::Status => {
                let mut new = old.clone();
                match candidate.get("status") {
                    Some(status) => new["status"] = status.clone(),
                    None => {
                        if let Value::Object(m) = &mut new {
                            m.remove("status");
                        }
                    }
                }
                new
            }
            Part::Main | Part::All => {
                let mut new = candidate;
                if part == Part::Main && kind.status {
                    match old.get("status") {
                        Some(status) => new["status"] = status.clone(),
                        None => {
                            if let Value::Object(m) = &mut new {
                                m.remove("status");
                            }
                        }
                    }
                }
                Self::normalise(kind, &mut new);
                for field in [
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                ] {
                    match old.get("metadata").and_then(|m| m.get(field)) {
                        Some(v) => set_meta(&mut new, field, v.clone()),
                        None => remove_meta(&mut new, field),
                    }
                }
                new
            }
        };
        set_meta(&mut new, "resourceVersion", old["metadata"]["resourceVersion"].clone());
        if part == Part::Main {
            let changed = immutable::violations(&kind.ar.group, &kind.ar.plural, &old, &new);
            if !changed.is_empty() {
                return Err(ApiError::invalid(
                    kind,
                    name,
                    changed
                        .iter()
                        .map(|f| format!("{f}: Invalid value: field is immutable"))
                        .collect::<Vec<_>>()
                        .join(", "),
                ));
            }
        }
        if meta_str(&old, "deletionTimestamp").is_some() {
            let before = finalizers(&old);
            if finalizers(&new).iter().any(|f| !before.contains(f)) {
                return Err(ApiError::invalid(
                    kind,
                    name,
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
                ));
            }
        }
        if spec_view(&new) != spec_view(&old) {
            let generation = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
            set_meta(&mut new, "generation", json!(generation + 1));
        }
        if dry_run {
            return Ok(present(kind, &new));
        }
        let stored = self.commit(&key, new);
        Ok(present(kind, &stored))
    }

    /// PATCH with any of the four content types. Apply creates the object when absent.
    pub(crate) fn patch(
        &mut self,
        kind: &KindInfo,
        namespace: Option<&str>,
        name: &str,
        part: Part,
        body: PatchBody,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let key = ObjKey::new(kind, namespace, name);
        match body {
            PatchBody::Merge(p) => self.update(kind, namespace, name, part, dry_run, |o| {
                patch::merge(o, &p);
                Ok(())
            }),
            PatchBody::Strategic(p) => self.update(kind, namespace, name, part, dry_run, |o| {
                patch::strategic_merge(o, &p);
                Ok(())
            }),
            PatchBody::Json(ops) => self.update(kind, namespace, name, part, dry_run, |o| {
                patch::json_patch(o, &ops).map_err(|e| {
                    ApiError::from_code(
                        422,
                        format!("the server rejected our request due to an error in our request: {e}"),
                    )
                })
            }),
            PatchBody::Apply { config, manager, force } => {
                if meta_str(&config, "name").is_some_and(|n| n != name) {
                    return Err(ApiError::bad_request(
                        "the name of the object does not match the name on the URL",
                    ));
                }
                let slot = (key.clone(), part == Part::Status);
                if !self.objects.contains_key(&key) {
                    if part == Part::Status {
                        return Err(ApiError::not_found(kind, name));
                    }
                    if meta_str(&config, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
                        return Err(ApiError::not_found(kind, name));
                    }
                    let mut obj = config.clone();
                    set_meta(&mut obj, "name", json!(name));
                    let created = self.create(kind, namespace, obj, Part::Main, dry_run)?;
                    if !dry_run {
                        self.applied.entry(slot).or_default().insert(manager, config);
                    }
                    return Ok(present(kind, &created));
                }
                let managers = self.applied.get(&slot).cloned().unwrap_or_default();
                let others = managers.iter().filter(|(m, _)| **m != manager);
                if !force {
                    let live = self.objects.get(&key).cloned().unwrap_or_default();
                    let conflicts = ssa::apply_conflicts(
                        &live,
                        &config,
                        others.clone().map(|(m, v)| (m.as_str(), v)),
                        !kind.custom,
                    );
                    if !conflicts.is_empty() {
                        return Err(ApiError::conflict(
                            kind,
                            name,
                            &format!(
                                "Apply failed with {} conflicts: {}",
                                conflicts.len(),
                                conflicts.join("; ")
                            ),
                        ));
                    }
                }
                let previous = managers.get(&manager);
                let result = self.update(kind, namespace, name, part, dry_run, |o| {
                    ssa::server_side_apply(o, previous, &config, others.clone().map(|(_, v)| v), !kind.custom);
                    Ok(())
                })?;
                if !dry_run && self.objects.contains_key(&key) {
                    self.applied.entry(slot).or_default().insert(manager, config);
                }
                Ok(result)
            }
        }
    }

    /// DELETE with optional uid / resourceVersion preconditions.
    pub(crate) fn delete(
        &mut self,
        kind: &KindInfo,
        namespace: Option<&str>,
        name: &str,
        policy: Propagation,
        preconditions: (Option<String>, Option<String>),
        dry_run: bool,
    ) -> Result<Deleted, ApiError> {
        let key = ObjKey::new(kind, namespace, name);
        let obj = self.objects.get(&key).ok_or_else(|| ApiError::not_found(kind, name))?;
        let (uid, rv) = preconditions;
        if let Some(uid) = uid
            && Some(uid.as_str()) != meta_str(obj, "uid")
        {
            return Err(ApiError::conflict(
                kind,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(obj, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = rv
            && Some(rv.as_str()) != meta_str(obj, "resourceVersion")
        {
            return Err(ApiError::stale(kind, name));
        }
        if dry_run {
            return Ok(if has_finalizers(obj) {
                Deleted::Pending(present(kind, obj))
            } else {
                Deleted::Gone(present(kind, obj))
            });
        }
        match self.delete_with(&key, policy) {
            Some((obj, true)) => Ok(Deleted::Gone(present(kind, &obj))),
            Some((obj, false)) => Ok(Deleted::Pending(present(kind, &obj))),
            None => Err(ApiError::not_found(kind, name)),
        }
    }
}

/// The object as served for `kind` (its apiVersion follows the requested version).
pub(crate) fn present(kind: &KindInfo, obj: &Value) -> Value {
    let mut obj = obj.clone();
    if obj.is_object() {
        obj["apiVersion"] = json!(kind.ar.api_version);
        obj["kind"] = json!(kind.ar.kind);
    }
    obj
}
