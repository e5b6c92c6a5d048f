//! Go `flag`-package spellings of the provisioners hpp-provisioner replaces, so their manifests
//! keep working with only the image changed: torchbox's `-name=torchbox.com/hostpath`,
//! `-id`, `-kubeconfig`, `-master`, and the glog/klog flags (`-v=3`, `-logtostderr`) the
//! KubeVirt legacy and incubator provisioners accepted.

use std::ffi::OsString;

/// Go flag name → hpp-provisioner long flag.
const RENAMES: &[(&str, &str)] = &[
    ("name", "provisioner-name"),
    ("id", "identity"),
    ("kubeconfig", "kubeconfig"),
    ("master", "master"),
    ("v", "v"),
    ("logtostderr", "logtostderr"),
    ("alsologtostderr", "alsologtostderr"),
    ("stderrthreshold", "stderrthreshold"),
    ("log_dir", "log_dir"),
    ("vmodule", "vmodule"),
];

/// Rewrites `-name=x`, `-name x`, `--name=x` and the other Go spellings in `RENAMES` to the
/// long flags clap knows. Everything else, and everything after `--`, is left alone.
pub fn normalize(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut rest_verbatim = false;
    for (i, arg) in args.into_iter().enumerate() {
        if i == 0 || rest_verbatim {
            out.push(arg);
            continue;
        }
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            rest_verbatim = true;
            out.push(arg);
            continue;
        }
        let bare = text.strip_prefix("--").or_else(|| text.strip_prefix('-'));
        let rewritten = bare.and_then(|bare| {
            let (name, value) = match bare.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (bare, None),
            };
            RENAMES.iter().find(|(go, _)| *go == name).map(|(_, ours)| match value {
                Some(v) => format!("--{ours}={v}"),
                None => format!("--{ours}"),
            })
        });
        out.push(rewritten.map_or(arg, OsString::from));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(args: &[&str]) -> Vec<String> {
        normalize(args.iter().map(OsString::from))
            .into_iter()
            .map(|s| s.into_string().unwrap_or_default())
            .collect()
    }

    #[test]
    fn go_spellings_become_long_flags() {
        assert_eq!(
            n(&[
                "p",
                "-name=torchbox.com/hostpath",
                "-kubeconfig",
                "/k",
                "-v=3",
                "--id=x"
            ]),
            [
                "p",
                "--provisioner-name=torchbox.com/hostpath",
                "--kubeconfig",
                "/k",
                "--v=3",
                "--identity=x"
            ]
        );
        // Our own flags and unknown ones are untouched; so is everything after `--`.
        assert_eq!(
            n(&["p", "--mode", "shared", "-x", "--", "-name=a"]),
            ["p", "--mode", "shared", "-x", "--", "-name=a"]
        );
    }
}
