//! A CO whose deadline passes drops its CreateVolume and retries at once. The first attempt's
//! copy keeps running in the driver; the retry must neither race it nor bind the PVC to a
//! partial clone.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::path::Path;

use common::*;
use hpp_csi::csi::{self, volume_content_source};
use tonic::Code;

fn clone_req(name: &str, src: &str) -> csi::CreateVolumeRequest {
    let mut req = create_req(name);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource { volume_id: src.into() },
        )),
    });
    req
}

/// Every file below `dir`, relative, with its content, sorted.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Whether a temporary of `name` exists in `pool` and already holds copied entries.
fn copy_under_way(pool: &Path, name: &str) -> bool {
    std::fs::read_dir(pool).unwrap().any(|e| {
        let e = e.unwrap();
        e.file_name()
            .to_string_lossy()
            .starts_with(&format!(".hpp-tmp-{name}-"))
            && std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_some())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_clone_retried_at_once_ends_byte_identical_to_the_source() {
    let mut h = Harness::start().await;
    h.create("pvc-src").await;
    let src = h.pool_path().join("pvc-src");
    // Enough files that the copy (no reflink on the test filesystem) is still running when the
    // client gives up.
    for d in 0..40 {
        let dir = src.join(format!("d{d:02}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..100 {
            let body: Vec<u8> = (0..8192u32).map(|i| (i ^ (d * 131 + f * 7)) as u8).collect();
            std::fs::write(dir.join(format!("f{f:03}")), body).unwrap();
        }
    }
    let mut c = h.controller.clone();
    let first = tokio::spawn(async move { c.create_volume(clone_req("pvc-clone", "pvc-src")).await });
    while !copy_under_way(&h.pool_path(), "pvc-clone") && !first.is_finished() {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    // The client's deadline passes: its request is dropped (the stream is reset).
    first.abort();
    let _ = first.await;
    // The retry comes at once, and again after each Aborted, as the provisioner's backoff does.
    let mut aborted = 0;
    loop {
        match h.controller.create_volume(clone_req("pvc-clone", "pvc-src")).await {
            Ok(r) => {
                assert_eq!(r.into_inner().volume.unwrap().volume_id, "pvc-clone");
                break;
            }
            Err(s) if s.code() == Code::Aborted => {
                aborted += 1;
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            Err(s) => panic!("retry failed: {s:?}"),
        }
    }
    eprintln!("retry answered Aborted {aborted} time(s) while the first attempt was copying");
    let want = tree(&src);
    assert_eq!(want.len(), 4000);
    assert!(
        tree(&h.pool_path().join("pvc-clone")) == want,
        "clone is byte-identical to the source"
    );
    let leftovers: Vec<_> = std::fs::read_dir(h.pool_path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".hpp-") && n != hpp_csi::ops::volume_journal::JOURNAL_NAME)
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    h.stop().await;
}
