//! kill -9 of the `hpp-csi-driver` process while 16 clients call it over its socket, at several
//! moments, each followed by a start. Controller side: every create the driver answered is a
//! volume on disk, every delete it answered stays done, every call it did not answer succeeds when
//! sent again to the new process (the CO's retry), and nothing half-made is left in the pool.
//! Node side: publishes and unpublishes cut short succeed when sent again, and at the end no
//! mount is left and every volume can be deleted. Snapshots and clones: the same for
//! CreateSnapshot, CreateVolume from a snapshot and their deletes, and every clone answered
//! holds its source's data.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hpp_csi::csi;
use hpp_csi::csi::controller_client::ControllerClient;
use hpp_csi::csi::identity_client::IdentityClient;
use hpp_csi::csi::node_client::NodeClient;
use hpp_csi::endpoint::Endpoint;
use tonic::transport::Channel;

const CLIENTS: usize = 16;
const ROUNDS: u64 = 6;

fn start(dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hpp-csi-driver"))
        .env("RUST_LOG", "warn")
        .args(["--endpoint", &format!("unix://{}", dir.join("csi.sock").display())])
        .args(["--datadir-root", &dir.join("data").display().to_string()])
        .args(["--drivername", "test.hpp.io", "--metrics-address", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// A channel to the driver once it answers Probe (30 s at most).
async fn connected(dir: &Path) -> Channel {
    let endpoint = Endpoint::Unix(dir.join("csi.sock"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(channel) = hpp_csi::client::connect(&endpoint).await
            && IdentityClient::new(channel.clone())
                .probe(csi::ProbeRequest {})
                .await
                .is_ok()
        {
            return channel;
        }
        assert!(Instant::now() < deadline, "the driver did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn create_request(name: &str) -> csi::CreateVolumeRequest {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![csi::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        }],
        ..Default::default()
    }
}

fn delete_request(id: &str) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest {
        volume_id: id.to_owned(),
        secrets: Default::default(),
    }
}

/// A call the driver was sent.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Call {
    Create(String),
    Delete(String),
}

async fn send(ctl: &mut ControllerClient<Channel>, call: &Call) -> Result<(), tonic::Status> {
    match call {
        Call::Create(id) => ctl.create_volume(create_request(id)).await.map(drop),
        Call::Delete(id) => ctl.delete_volume(delete_request(id)).await.map(drop),
    }
}

/// What client `n` sends in `round`: creates, deleting every third volume it made.
fn volume_plan(round: u64, n: usize) -> impl Iterator<Item = Call> + Send + 'static {
    (0u64..).flat_map(move |i| {
        let mut calls = vec![Call::Create(format!("pvc-r{round}-c{n}-{i}"))];
        if i % 3 == 2 {
            calls.push(Call::Delete(format!("pvc-r{round}-c{n}-{}", i - 1)));
        }
        calls
    })
}

/// One client: sends the calls of `plan` until one fails (the driver was killed); returns the
/// calls answered and the one cut short.
async fn client<C, S, SFut>(channel: Channel, plan: impl Iterator<Item = C>, send: S) -> (Vec<C>, C)
where
    S: Fn(Channel, &C) -> SFut,
    SFut: Future<Output = Result<(), tonic::Status>>,
{
    let mut answered = Vec::new();
    for call in plan {
        if send(channel.clone(), &call).await.is_err() {
            return (answered, call);
        }
        answered.push(call);
    }
    unreachable!("a plan goes on until the driver is killed")
}

/// The kill loop the tests share. [`ROUNDS`] times: sends again the calls the last kill cut
/// short (each must succeed against the new process, as the CO's retry would), runs [`CLIENTS`]
/// clients (client `n` sends `plan(round, n)` until a call fails), kills the driver (SIGKILL)
/// `40 + 60 × round` ms in, and starts it again. Then sends the last round's cut-short calls
/// again. Returns every call answered, the retries included (so every call made), how many were
/// cut short, and a channel to the driver still running.
async fn kill_rounds<C, P, I, S, SFut>(dir: &Path, driver: &mut Child, plan: P, send: S) -> (Vec<C>, usize, Channel)
where
    C: std::fmt::Debug + Send + 'static,
    P: Fn(u64, usize) -> I,
    I: Iterator<Item = C> + Send + 'static,
    S: Fn(Channel, &C) -> SFut + Clone + Send + 'static,
    SFut: Future<Output = Result<(), tonic::Status>> + Send + 'static,
{
    let (mut answered, mut cut_short, mut retried) = (Vec::new(), Vec::new(), 0);
    for round in 0..=ROUNDS {
        let channel = connected(dir).await;
        retried += cut_short.len();
        for call in cut_short.drain(..) {
            send(channel.clone(), &call)
                .await
                .unwrap_or_else(|e| panic!("{call:?} sent again after a restart: {e:?}"));
            answered.push(call);
        }
        if round == ROUNDS {
            return (answered, retried, channel);
        }
        let clients: Vec<_> = (0..CLIENTS)
            .map(|n| tokio::spawn(client(channel.clone(), plan(round, n), send.clone())))
            .collect();
        tokio::time::sleep(Duration::from_millis(40 + 60 * round)).await;
        driver.kill().unwrap();
        driver.wait().unwrap();
        for c in clients {
            let (done, call) = tokio::time::timeout(Duration::from_secs(60), c)
                .await
                .expect("a client noticed the driver is gone")
                .unwrap();
            answered.extend(done);
            cut_short.push(call);
        }
        *driver = start(dir);
    }
    unreachable!("the last round returns")
}

fn pool_entries(pool: &Path) -> BTreeSet<String> {
    std::fs::read_dir(pool)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

/// The volumes (or snapshots) in `dir`, after checking it holds no temporary and no
/// half-deleted one.
fn complete_entries(dir: &Path) -> BTreeSet<String> {
    let entries = pool_entries(dir);
    let half_made: Vec<&String> = entries
        .iter()
        .filter(|name| name.starts_with(".hpp-") && name.as_str() != ".hpp-journal")
        .collect();
    assert!(half_made.is_empty(), "left in {}: {half_made:?}", dir.display());
    entries.into_iter().filter(|n| !n.starts_with('.')).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_driver_under_load_converges_after_a_start() {
    let dir = tempfile::tempdir().unwrap();
    let pool: PathBuf = dir.path().join("data/pools/legacy");
    let mut driver = start(dir.path());
    let (answered, retried, channel) = kill_rounds(dir.path(), &mut driver, volume_plan, |channel, call| {
        let call = call.clone();
        async move { send(&mut ControllerClient::new(channel), &call).await }
    })
    .await;
    let listed = list_all(&mut ControllerClient::new(channel)).await;
    driver.kill().unwrap();
    driver.wait().unwrap();

    let (mut created, mut deleted) = (BTreeSet::new(), BTreeSet::new());
    for call in answered {
        match call {
            Call::Create(id) => created.insert(id),
            Call::Delete(id) => deleted.insert(id),
        };
    }
    eprintln!(
        "answered: {} creates, {} deletes; {retried} calls cut short by a kill and sent again",
        created.len(),
        deleted.len()
    );
    assert!(created.len() >= 50, "the clients created too little: {}", created.len());
    // Every client had a call in flight at every kill.
    assert_eq!(retried, CLIENTS * ROUNDS as usize);
    // Neither a temporary nor a half-deleted volume is left.
    let volumes = complete_entries(&pool);
    for id in &deleted {
        assert!(!volumes.contains(id), "{id} was answered deleted and is back");
    }
    // Every call a kill cut short was sent again and answered, so what is there is exactly what
    // was answered; and ListVolumes, page by page, lists it.
    let expected: BTreeSet<String> = created.difference(&deleted).cloned().collect();
    assert_eq!(volumes, expected);
    assert_eq!(listed, volumes);
}

/// Every volume ListVolumes lists, 500 a page.
async fn list_all(ctl: &mut ControllerClient<Channel>) -> BTreeSet<String> {
    let mut listed = BTreeSet::new();
    let mut starting_token = String::new();
    loop {
        let page = ctl
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 500,
                starting_token,
            })
            .await
            .unwrap()
            .into_inner();
        for entry in page.entries {
            let id = entry.volume.unwrap().volume_id;
            assert!(listed.insert(id.clone()), "{id} listed twice");
        }
        if page.next_token.is_empty() {
            return listed;
        }
        starting_token = page.next_token;
    }
}

/// Detaches whatever is still mounted below a test's directory, also when the test fails.
struct UnmountBelow(PathBuf);

impl Drop for UnmountBelow {
    fn drop(&mut self) {
        if let Ok(table) = hpp_csi::mountinfo::MountTable::read() {
            for m in table.mounts_below(&self.0).into_iter().rev() {
                let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

/// A node call the driver was sent: client `n` publishes or unpublishes its volume.
#[derive(Debug, Clone, Copy)]
enum NodeCall {
    Publish(usize),
    Unpublish(usize),
}

fn volume_of(n: usize) -> String {
    format!("pvc-node-{n}")
}

async fn send_node(node: &mut NodeClient<Channel>, targets: &Path, call: NodeCall) -> Result<(), tonic::Status> {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    match call {
        NodeCall::Publish(n) => node
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: volume_of(n),
                target_path: targets.join(n.to_string()).display().to_string(),
                volume_capability: Some(csi::VolumeCapability {
                    access_type: Some(AccessType::Mount(MountVolume::default())),
                    access_mode: Some(AccessMode {
                        mode: Mode::SingleNodeWriter as i32,
                    }),
                }),
                // Every other client mounts read-only (a bind made read-only before it is
                // attached).
                readonly: n % 2 == 1,
                ..Default::default()
            })
            .await
            .map(drop),
        NodeCall::Unpublish(n) => node
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: volume_of(n),
                target_path: targets.join(n.to_string()).display().to_string(),
            })
            .await
            .map(drop),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_driver_while_it_mounts_converges_after_a_start() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: publishing mounts, which needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = UnmountBelow(dir.path().to_path_buf());
    let targets = dir.path().join("targets");
    std::fs::create_dir(&targets).unwrap();
    let mut driver = start(dir.path());
    let mut ctl = ControllerClient::new(connected(dir.path()).await);
    for n in 0..CLIENTS {
        send(&mut ctl, &Call::Create(volume_of(n))).await.unwrap();
    }
    // Client `n` publishes and unpublishes its volume, over and over.
    let t = targets.clone();
    let (answered, _, channel) = kill_rounds(
        dir.path(),
        &mut driver,
        |_, n| [NodeCall::Publish(n), NodeCall::Unpublish(n)].into_iter().cycle(),
        move |channel, call| {
            let (targets, call) = (t.clone(), *call);
            async move { send_node(&mut NodeClient::new(channel), &targets, call).await }
        },
    )
    .await;
    eprintln!("answered: {} publishes and unpublishes", answered.len());
    assert!(
        answered.len() >= 50,
        "the clients mounted too little: {}",
        answered.len()
    );
    // Whatever each client did last, unpublishing its target now leaves nothing mounted, and
    // every volume can then be deleted.
    let mut node = NodeClient::new(channel.clone());
    for n in 0..CLIENTS {
        send_node(&mut node, &targets, NodeCall::Unpublish(n))
            .await
            .unwrap_or_else(|e| panic!("unpublishing {n}: {e:?}"));
    }
    let left = hpp_csi::mountinfo::MountTable::read().unwrap().mounts_below(dir.path());
    assert!(left.is_empty(), "still mounted: {left:?}");
    let mut ctl = ControllerClient::new(channel);
    for n in 0..CLIENTS {
        send(&mut ctl, &Call::Delete(volume_of(n)))
            .await
            .unwrap_or_else(|e| panic!("deleting {}: {e:?}", volume_of(n)));
    }
    driver.kill().unwrap();
    driver.wait().unwrap();
    let volumes = complete_entries(&dir.path().join("data/pools/legacy"));
    assert!(volumes.is_empty(), "{volumes:?}");
}

/// A snapshot or clone call: snapshot `snap-…` of client `n`'s source, a clone `clone-…` of it,
/// or the deletion of either.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CopyCall {
    Snapshot { n: usize, id: String },
    Clone { n: usize, snapshot: String, id: String },
    DeleteClone(String),
    DeleteSnapshot(String),
}

fn source_of(n: usize) -> String {
    format!("pvc-src-{n}")
}

async fn send_copy(ctl: &mut ControllerClient<Channel>, call: &CopyCall) -> Result<(), tonic::Status> {
    match call {
        CopyCall::Snapshot { n, id } => {
            let made = ctl
                .create_snapshot(csi::CreateSnapshotRequest {
                    source_volume_id: source_of(*n),
                    name: id.clone(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            assert_eq!(made.snapshot.unwrap().snapshot_id, *id);
            Ok(())
        }
        CopyCall::Clone { snapshot, id, .. } => {
            use csi::volume_content_source::{SnapshotSource, Type};
            let mut req = create_request(id);
            req.volume_content_source = Some(csi::VolumeContentSource {
                r#type: Some(Type::Snapshot(SnapshotSource {
                    snapshot_id: snapshot.clone(),
                })),
            });
            ctl.create_volume(req).await.map(drop)
        }
        CopyCall::DeleteClone(id) => ctl.delete_volume(delete_request(id)).await.map(drop),
        CopyCall::DeleteSnapshot(id) => ctl
            .delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: id.clone(),
                secrets: Default::default(),
            })
            .await
            .map(drop),
    }
}

/// What client `n` sends in `round`: a snapshot of its source, a clone of that snapshot, and
/// the deletion of every other pair.
fn copy_plan(round: u64, n: usize) -> impl Iterator<Item = CopyCall> + Send + 'static {
    (0u64..).flat_map(move |i| {
        let snapshot = format!("snap-r{round}-c{n}-{i}");
        let clone = format!("clone-r{round}-c{n}-{i}");
        let mut calls = vec![
            CopyCall::Snapshot {
                n,
                id: snapshot.clone(),
            },
            CopyCall::Clone { n, snapshot, id: clone },
        ];
        if i % 2 == 1 {
            calls.push(CopyCall::DeleteClone(format!("clone-r{round}-c{n}-{}", i - 1)));
            calls.push(CopyCall::DeleteSnapshot(format!("snap-r{round}-c{n}-{}", i - 1)));
        }
        calls
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_driver_while_it_snapshots_and_clones_converges_after_a_start() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("data/pools/legacy");
    let snapshots = dir.path().join("data/snapshots/legacy");
    let mut driver = start(dir.path());
    let channel = connected(dir.path()).await;
    let mut ctl = ControllerClient::new(channel);
    for n in 0..CLIENTS {
        send(&mut ctl, &Call::Create(source_of(n))).await.unwrap();
        std::fs::write(pool.join(source_of(n)).join("data.txt"), format!("source {n}")).unwrap();
    }
    let (answered, _, channel) = kill_rounds(dir.path(), &mut driver, copy_plan, |channel, call| {
        let call = call.clone();
        async move { send_copy(&mut ControllerClient::new(channel), &call).await }
    })
    .await;
    let mut ctl = ControllerClient::new(channel);
    let listed = ctl
        .list_snapshots(csi::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    driver.kill().unwrap();
    driver.wait().unwrap();

    let (mut snaps, mut clones) = (BTreeSet::new(), BTreeMap::new());
    for call in &answered {
        match call {
            CopyCall::Snapshot { id, .. } => {
                snaps.insert(id.clone());
            }
            CopyCall::Clone { n, id, .. } => {
                clones.insert(id.clone(), *n);
            }
            CopyCall::DeleteClone(id) => {
                clones.remove(id);
            }
            CopyCall::DeleteSnapshot(id) => {
                snaps.remove(id);
            }
        }
    }
    eprintln!(
        "answered: {} snapshot and clone calls; {} snapshots and {} clones kept",
        answered.len(),
        snaps.len(),
        clones.len()
    );
    assert!(answered.len() >= 50, "the clients did too little: {}", answered.len());
    // Each clone holds the data of the source its snapshot was taken of.
    for (id, n) in &clones {
        assert_eq!(
            std::fs::read_to_string(pool.join(id).join("data.txt")).unwrap(),
            format!("source {n}"),
            "{id}"
        );
    }
    let sources: BTreeSet<String> = (0..CLIENTS).map(source_of).collect();
    let volumes = complete_entries(&pool);
    let expected: BTreeSet<String> = sources.into_iter().chain(clones.keys().cloned()).collect();
    assert_eq!(volumes, expected);
    let listed: BTreeSet<String> = listed
        .entries
        .into_iter()
        .map(|e| e.snapshot.unwrap().snapshot_id)
        .collect();
    assert_eq!(listed, snaps);
    assert_eq!(complete_entries(&snapshots), snaps);
}
