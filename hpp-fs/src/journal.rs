//! An intent journal: a preallocated file of checksummed records that makes a change durable
//! with one `fdatasync` of already-allocated blocks instead of a directory `fsync`.
//!
//! Why: on a journaling filesystem a directory `fsync` is a journal commit of *everything*
//! anyone on the filesystem changed since the last one, so its cost follows the busiest
//! tenant. Overwriting blocks a file already owns needs no metadata, so its `fdatasync` is a
//! data write and a cache flush: a third of the commit here, and unaffected by others' churn.
//!
//! The caller makes its change first (in the page cache), then [`Journal::append`]s a record
//! that is enough to redo it, and acknowledges only after `append` returns. Concurrent appends
//! share one write and one `fdatasync` (group commit): an append that finds no flush running
//! flushes itself; one that finds a flush running queues its record, and when that flush ends
//! with records queued, they go to the journal's flusher thread, which keeps flushing while
//! records keep coming, so under load the device never waits for a sleeping thread to wake up
//! and take the next batch. After a crash the records that survived
//! ([`Journal::open`]) are redone by the caller, who then calls [`Journal::checkpoint`]. When
//! the file is full, a checkpoint runs `syncfs` (every change recorded so far is then on disk
//! by ordinary means) and starts a new epoch at the front of the file.
//!
//! Layout: two header slots (at 0 and 512, chosen by the epoch's parity, so a torn header write
//! leaves the other intact) holding the current epoch, then records from [`RECORDS_START`]:
//! `len u32 | crc32 u32 | epoch u64 | seq u64 | payload`, little-endian, the checksum over
//! epoch, seq and payload. Reading stops at the first record that is not the next one of the
//! current epoch: a torn write, a stale record of an older epoch, or zeros.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

/// Size of a new journal file: about 10,000 volume records between checkpoints.
pub const DEFAULT_CAPACITY: u64 = 4 << 20;
/// Where records begin (the headers live before it).
pub const RECORDS_START: u64 = 4096;
/// Largest payload accepted; anything a caller needs to redo a change is far smaller.
pub const MAX_PAYLOAD: usize = 16 << 10;
/// Largest journal file read: a bigger file under the name is not one this code made.
pub const MAX_CAPACITY: u64 = 64 << 20;
/// Smallest journal file: the headers and room for the largest record.
pub const MIN_CAPACITY: u64 = RECORDS_START + (RECORD_HEADER + MAX_PAYLOAD) as u64;

const MAGIC: &[u8; 8] = b"HPPJRNL1";
const HEADER_SLOT: u64 = 512;
const HEADER_LEN: usize = 20;
const RECORD_HEADER: usize = 24;
/// The flusher thread's stack: it only encodes records and makes system calls.
const FLUSHER_STACK: usize = 64 << 10;

/// What can go wrong with a journal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// A system call failed.
    #[error("{op} of the journal: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The errno.
        #[source]
        source: std::io::Error,
    },
    /// An earlier write or flush failed: after a failed `fdatasync` the page cache may no longer
    /// hold what was lost, so nothing more is trusted to this journal until the process restarts.
    #[error("an earlier flush of the journal failed ({0}); restart to recover")]
    Failed(std::io::Error),
    /// The journal did not exist and could not be made (full or read-only filesystem, say);
    /// nothing is left behind.
    #[error("cannot create the journal: {0}")]
    CannotCreate(#[source] std::io::Error),
    /// The file under the journal's name is no longer the one opened (another filesystem was
    /// mounted over the directory, or the file was replaced): open the journal again.
    #[error("the journal file was replaced (another filesystem mounted over its directory?)")]
    Replaced,
    /// The file is not a journal (no valid header).
    #[error("the file is not an hpp journal (no valid header)")]
    NotAJournal,
    /// Appended to before [`Journal::checkpoint`] ran after [`Journal::open`]: a torn batch of
    /// the last run may hide an older, valid record just past the write position.
    #[error("the journal must be checkpointed after opening before it is appended to")]
    NotCheckpointed,
    /// A record larger than [`MAX_PAYLOAD`].
    #[error("a journal record of {0} bytes is larger than the {MAX_PAYLOAD} allowed")]
    TooLarge(usize),
}

/// The error every later call gets once a flush failed with `e` (`ESTALE`: the file was replaced).
fn failure(e: Errno) -> JournalError {
    match e {
        Errno::STALE => JournalError::Replaced,
        other => JournalError::Failed(other.into()),
    }
}

fn io(op: &'static str) -> impl FnOnce(Errno) -> JournalError {
    move |e| JournalError::Io { op, source: e.into() }
}

/// A journal, ready for appending. No descriptor is held while the journal is idle: each flush
/// opens the file through a caller's directory descriptor and checks it is still the same file,
/// so the journal never keeps its filesystem from being unmounted, and never writes to a file
/// that a mount over the directory has hidden.
#[derive(Debug)]
pub struct Journal {
    shared: Arc<Shared>,
}

/// What the appending callers and the flusher thread share.
#[derive(Debug)]
struct Shared {
    name: String,
    /// Device and inode of the file.
    identity: (u64, u64),
    capacity: u64,
    state: Mutex<State>,
    flushed: Condvar,
    /// Wakes the flusher thread: a batch was handed to it, or the journal was dropped.
    handed_off: Condvar,
}

struct State {
    epoch: u64,
    /// Sequence number of the last record written in this epoch.
    seq: u64,
    /// Where the next record goes.
    offset: u64,
    /// Payloads waiting for the next flush.
    queue: Vec<Vec<u8>>,
    /// Callbacks of queued [`Journal::append_then`] records, called once their flush is done.
    callbacks: Vec<Durable>,
    /// Tickets handed out (one per append) and the last one made durable.
    enqueued: u64,
    durable: u64,
    flushing: bool,
    /// A checkpoint ran since the journal was opened: appending is allowed.
    ready: bool,
    failed: Option<Errno>,
    flushes: u64,
    records: u64,
    checkpoints: u64,
    handoffs: u64,
    flusher: Flusher,
    /// The directory the flusher flushes through: a duplicate of the descriptor of the caller
    /// who handed it the queue, dropped as soon as the queue runs dry.
    handoff_dir: Option<OwnedFd>,
    dropped: bool,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("epoch", &self.epoch)
            .field("seq", &self.seq)
            .field("queued", &self.queue.len())
            .field("enqueued", &self.enqueued)
            .field("durable", &self.durable)
            .field("flushing", &self.flushing)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// Called once, from whichever thread ran the flush, with the outcome of a record appended by
/// [`Journal::append_then`]. It should only hand the outcome on (it delays the flushes behind it).
pub type Durable = Box<dyn FnOnce(Result<(), JournalError>) + Send>;

/// The flusher thread, started at the first hand-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flusher {
    NotStarted,
    Running,
    /// It could not be started: callers take turns flushing instead.
    Unavailable,
}

/// Counters for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// `fdatasync` calls that made appends durable.
    pub flushes: u64,
    /// Records those flushes made durable (over `flushes`: how many requests shared a flush).
    pub records: u64,
    /// Checkpoints (each a `syncfs` and a new epoch).
    pub checkpoints: u64,
    /// Times a flush ended with records queued and handed them to the flusher thread.
    pub handoffs: u64,
}

impl Journal {
    /// Opens journal `name` in directory `dir`, creating it (preallocated to `capacity` bytes,
    /// durably) when missing. Returns the journal and the payloads of the current epoch's
    /// records, oldest first: the caller redoes them, then calls [`checkpoint`](Self::checkpoint)
    /// before appending.
    pub fn open(dir: BorrowedFd<'_>, name: &str, capacity: u64) -> Result<(Journal, Vec<Vec<u8>>), JournalError> {
        let file = match rustix::fs::openat(
            dir,
            name,
            OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => create(dir, name, capacity)?,
            // A directory or symlink of that name: not ours, and not touched.
            Err(Errno::ISDIR | Errno::LOOP) => return Err(JournalError::NotAJournal),
            Err(e) => return Err(io("open")(e)),
        };
        let stat = rustix::fs::fstat(&file).map_err(io("stat"))?;
        if !rustix::fs::FileType::from_raw_mode(stat.st_mode).is_file() {
            return Err(JournalError::NotAJournal);
        }
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        if !(MIN_CAPACITY..=MAX_CAPACITY).contains(&size) {
            return Err(JournalError::NotAJournal);
        }
        let mut head = vec![0u8; RECORDS_START as usize];
        read_exact_at(file.as_fd(), &mut head, 0)?;
        let epoch = [0, HEADER_SLOT as usize]
            .into_iter()
            .filter_map(|at| parse_header(&head[at..at + HEADER_LEN]))
            .max()
            .filter(|epoch| *epoch < u64::MAX)
            .ok_or(JournalError::NotAJournal)?;
        let mut body = vec![0u8; (size - RECORDS_START) as usize];
        read_exact_at(file.as_fd(), &mut body, RECORDS_START)?;
        let (records, used, seq) = parse_records(&body, epoch);
        let shared = Shared {
            name: name.to_owned(),
            identity: (stat.st_dev, stat.st_ino),
            capacity: size,
            state: Mutex::new(State {
                epoch,
                seq,
                offset: RECORDS_START + used as u64,
                queue: Vec::new(),
                callbacks: Vec::new(),
                enqueued: 0,
                durable: 0,
                flushing: false,
                ready: false,
                failed: None,
                flushes: 0,
                records: 0,
                checkpoints: 0,
                handoffs: 0,
                flusher: Flusher::NotStarted,
                handoff_dir: None,
                dropped: false,
            }),
            flushed: Condvar::new(),
            handed_off: Condvar::new(),
        };
        Ok((
            Journal {
                shared: Arc::new(shared),
            },
            records,
        ))
    }

    /// Returns once `payload` is durable in the journal, found in `dir` (the directory it was
    /// opened in). The change it describes must already be made. Blocks the calling thread:
    /// call it from blocking code.
    pub fn append(&self, dir: BorrowedFd<'_>, payload: &[u8]) -> Result<(), JournalError> {
        let shared = &*self.shared;
        let (mut st, ticket) = self.enqueue(dir, payload, None)?;
        loop {
            if st.durable >= ticket {
                return Ok(());
            }
            if let Some(e) = st.failed {
                return Err(failure(e));
            }
            if !st.flushing {
                st.flushing = true;
                st = shared.flush_queue(st, dir, &mut None);
                // Records queued while this flush ran are the flusher's to write; this caller's
                // own record is durable (or failed), so it answers without waiting for them.
                st = self.pass_on(st, dir);
                continue;
            }
            st = shared.flushed.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Queues `payload` and returns without waiting: `done` is called with the outcome once the
    /// flush that covers it ends, on the thread that ran it (the flusher's, usually). For callers
    /// that should not hold a thread while the record is flushed (an async task, say); what
    /// [`append`](Self::append) requires of `dir` and the change holds here too. An error
    /// returned here means the record was not queued, and `done` is dropped uncalled.
    pub fn append_then(&self, dir: BorrowedFd<'_>, payload: &[u8], done: Durable) -> Result<(), JournalError> {
        let (mut st, _) = self.enqueue(dir, payload, Some(done))?;
        if !st.flushing {
            st.flushing = true;
            drop(self.pass_on(st, dir));
        }
        // Otherwise the running flush passes the queue on when it ends.
        Ok(())
    }

    /// Checks an append and queues its record (with `done`, when the caller does not wait);
    /// returns the lock and the record's ticket.
    fn enqueue(
        &self,
        dir: BorrowedFd<'_>,
        payload: &[u8],
        done: Option<Durable>,
    ) -> Result<(MutexGuard<'_, State>, u64), JournalError> {
        if payload.len() > MAX_PAYLOAD || payload.is_empty() {
            return Err(JournalError::TooLarge(payload.len()));
        }
        // The caller changed things through `dir`: its record must go to the journal there, not to
        // one another filesystem mounted over the directory has hidden from it.
        if !self.is_in(dir) {
            return Err(JournalError::Replaced);
        }
        let mut st = self.shared.lock();
        if let Some(e) = st.failed {
            return Err(failure(e));
        }
        if !st.ready {
            return Err(JournalError::NotCheckpointed);
        }
        st.enqueued += 1;
        st.queue.push(payload.to_vec());
        st.callbacks.extend(done);
        let ticket = st.enqueued;
        Ok((st, ticket))
    }

    /// With `flushing` held and a flush just ended: gives what is queued to the flusher thread,
    /// or, without one, flushes (or fails) it here and clears `flushing`; then wakes the callers
    /// waiting in `append`.
    fn pass_on<'a>(&'a self, mut st: MutexGuard<'a, State>, dir: BorrowedFd<'_>) -> MutexGuard<'a, State> {
        let handed_off = !st.queue.is_empty() && st.failed.is_none() && self.hand_off(&mut st, dir);
        if !handed_off {
            st = self.shared.drain(st, dir);
            st = self.shared.fail_stranded(st);
            st.flushing = false;
        }
        self.shared.flushed.notify_all();
        st
    }

    /// Gives the queued records to the flusher thread (started on first use), with a duplicate
    /// of `dir` to flush through. False when the thread or the duplicate cannot be had: the
    /// queued callers then take turns, as they would without the thread.
    fn hand_off(&self, st: &mut State, dir: BorrowedFd<'_>) -> bool {
        if st.flusher == Flusher::NotStarted {
            let shared = self.shared.clone();
            let started = std::thread::Builder::new()
                .name("hpp-journal".to_owned())
                .stack_size(FLUSHER_STACK)
                .spawn(move || shared.run_flusher());
            st.flusher = match started {
                Ok(_) => Flusher::Running,
                Err(_) => Flusher::Unavailable,
            };
        }
        if st.flusher != Flusher::Running {
            return false;
        }
        let Ok(dup) = rustix::io::fcntl_dupfd_cloexec(dir, 0) else {
            return false;
        };
        st.handoff_dir = Some(dup);
        st.handoffs += 1;
        self.shared.handed_off.notify_one();
        true
    }

    /// Makes every change on the journal's filesystem durable (`syncfs`) and starts a new epoch,
    /// so the records so far are no longer needed. Call after redoing what [`open`](Self::open)
    /// returned.
    pub fn checkpoint(&self, dir: BorrowedFd<'_>) -> Result<(), JournalError> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        while st.flushing {
            st = shared.flushed.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        if let Some(e) = st.failed {
            return Err(failure(e));
        }
        st.flushing = true;
        let epoch = st.epoch;
        drop(st);
        let outcome = shared
            .file_in(dir)
            .and_then(|file| start_epoch(file.as_fd(), epoch + 1));
        let mut st = shared.lock();
        let result = match outcome {
            Ok(()) => {
                st.checkpoints += 1;
                st.ready = true;
                (st.epoch, st.seq, st.offset) = (epoch + 1, 0, RECORDS_START);
                Ok(())
            }
            Err(e) => {
                st.failed = Some(e);
                Err(failure(e))
            }
        };
        // Records queued meanwhile by callers that do not wait in `append` have no one else to
        // flush (or fail) them.
        drop(self.pass_on(st, dir));
        result
    }

    /// Whether the journal file under its name in `dir` is the one this journal opened (another
    /// filesystem mounted over the directory, or a replaced file, make it another).
    pub fn is_in(&self, dir: BorrowedFd<'_>) -> bool {
        self.shared.named_in(dir)
    }

    /// The file's device and inode numbers.
    pub fn identity(&self) -> (u64, u64) {
        self.shared.identity
    }

    /// Flushes, checkpoints and hand-offs so far.
    pub fn stats(&self) -> JournalStats {
        let st = self.shared.lock();
        JournalStats {
            flushes: st.flushes,
            records: st.records,
            checkpoints: st.checkpoints,
            handoffs: st.handoffs,
        }
    }
}

impl Drop for Journal {
    /// Lets the flusher thread end, once it has flushed what it was handed (records of
    /// [`append_then`](Journal::append_then) callers may still be queued).
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.dropped = true;
        drop(st);
        self.shared.handed_off.notify_all();
    }
}

impl Shared {
    /// The flusher thread: flushes what is handed to it, and goes on while records keep
    /// coming, until the queue is empty.
    fn run_flusher(&self) {
        let mut st = self.lock();
        loop {
            // A batch handed over is flushed even when the journal was dropped meanwhile: its
            // callers did not wait in `append`, so the journal's owner may be gone.
            let Some(dir) = st.handoff_dir.take() else {
                if st.dropped {
                    return;
                }
                st = self.handed_off.wait(st).unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            // `flushing` stays set from the hand-off on, so no caller starts a flush meanwhile.
            st = self.drain(st, dir.as_fd());
            st.flushing = false;
            self.flushed.notify_all();
            drop(st);
            drop(dir);
            st = self.lock();
        }
    }

    /// Flushes through `dir` until nothing is queued (or a flush failed), waking the callers
    /// each flush covered; the caller set `flushing` and clears it.
    fn drain<'a>(&'a self, mut st: MutexGuard<'a, State>, dir: BorrowedFd<'_>) -> MutexGuard<'a, State> {
        // The file is opened (and checked) once for the whole run of flushes, not per flush.
        let mut file = None;
        while !st.queue.is_empty() && st.failed.is_none() {
            st = self.flush_queue(st, dir, &mut file);
            self.flushed.notify_all();
        }
        st
    }

    /// Writes and flushes every queued record through `file`, opened through `dir` when `None`
    /// (and kept for the next flush), with the lock released meanwhile; the caller set `flushing`. Returns with the lock held and the outcome recorded, but
    /// waiters not yet woken.
    fn flush_queue<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        dir: BorrowedFd<'_>,
        file: &mut Option<OwnedFd>,
    ) -> MutexGuard<'a, State> {
        let batch = std::mem::take(&mut st.queue);
        let mut callbacks = std::mem::take(&mut st.callbacks);
        let last = st.enqueued;
        let (epoch, seq, offset) = (st.epoch, st.seq, st.offset);
        drop(st);
        // A file kept from the previous flush of this run is checked again by name: a record
        // written to a file replaced meanwhile would be acknowledged and never read back.
        let opened = match file.take() {
            Some(f) if self.named_in(dir) => Ok(f),
            Some(_) => Err(Errno::STALE),
            None => self.file_in(dir),
        };
        let outcome = opened.and_then(|f| {
            let written = self.write_batch(f.as_fd(), &batch, epoch, seq, offset);
            *file = Some(f);
            written
        });
        let mut st = self.lock();
        match outcome {
            Ok(done) => {
                st.flushes += 1;
                st.records += batch.len() as u64;
                st.checkpoints += done.checkpoints;
                (st.epoch, st.seq, st.offset) = (done.epoch, done.seq, done.offset);
                st.durable = last;
            }
            Err(e) => st.failed = Some(e),
        }
        if st.failed.is_some() {
            // Nothing is flushed after a failure: what is still queued fails with it.
            st.queue.clear();
            callbacks.append(&mut st.callbacks);
        }
        self.call_back(st, callbacks)
    }

    /// After a failure, fails the callbacks of records still queued.
    fn fail_stranded<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        if st.failed.is_none() {
            return st;
        }
        st.queue.clear();
        let stranded = std::mem::take(&mut st.callbacks);
        self.call_back(st, stranded)
    }

    /// Calls `callbacks` with the journal's state (failed or not), with the lock released.
    fn call_back<'a>(&'a self, st: MutexGuard<'a, State>, callbacks: Vec<Durable>) -> MutexGuard<'a, State> {
        if callbacks.is_empty() {
            return st;
        }
        let failed = st.failed;
        drop(st);
        for done in callbacks {
            done(failed.map_or(Ok(()), |e| Err(failure(e))));
        }
        self.lock()
    }

    /// Writes `batch` from `offset` on, checkpointing whenever the next record does not fit,
    /// then flushes. Only the leader of a round calls it.
    fn write_batch(
        &self,
        file: BorrowedFd<'_>,
        batch: &[Vec<u8>],
        mut epoch: u64,
        mut seq: u64,
        mut offset: u64,
    ) -> Result<Written, Errno> {
        let mut buf = Vec::new();
        let mut checkpoints = 0;
        for payload in batch {
            let len = (RECORD_HEADER + payload.len()) as u64;
            if offset + (buf.len() as u64) + len > self.capacity {
                // What was encoded in the old epoch need not be written: the checkpoint's
                // syncfs makes the changes it describes durable.
                buf.clear();
                epoch += 1;
                start_epoch(file, epoch)?;
                checkpoints += 1;
                (seq, offset) = (0, RECORDS_START);
            }
            seq += 1;
            encode_record(&mut buf, epoch, seq, payload);
        }
        write_all_at(file, &buf, offset)?;
        rustix::fs::fdatasync(file)?;
        Ok(Written {
            epoch,
            seq,
            offset: offset + buf.len() as u64,
            checkpoints,
        })
    }

    /// Whether the file under the journal's name in `dir` is still the one opened.
    fn named_in(&self, dir: BorrowedFd<'_>) -> bool {
        rustix::fs::statat(dir, self.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| (st.st_dev, st.st_ino) == self.identity)
    }

    /// The journal file in `dir`, provided it is still the one opened (else `ESTALE`).
    fn file_in(&self, dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
        let file = rustix::fs::openat(
            dir,
            self.name.as_str(),
            OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| if e == Errno::NOENT { Errno::STALE } else { e })?;
        let stat = rustix::fs::fstat(&file)?;
        if (stat.st_dev, stat.st_ino) != self.identity {
            return Err(Errno::STALE);
        }
        Ok(file)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Written {
    epoch: u64,
    seq: u64,
    offset: u64,
    checkpoints: u64,
}

/// Creates journal `name`: a temporary filled with zeros (so later writes allocate nothing),
/// with the epoch-1 header, synced, renamed into place and the directory synced.
fn create(dir: BorrowedFd<'_>, name: &str, capacity: u64) -> Result<OwnedFd, JournalError> {
    let tmp = format!("{name}.new");
    let made = make_file(dir, &tmp, name, capacity.max(MIN_CAPACITY));
    if made.is_err() {
        let _ = rustix::fs::unlinkat(dir, &tmp, AtFlags::empty());
    }
    made.map_err(|e| JournalError::CannotCreate(e.into()))
}

fn make_file(dir: BorrowedFd<'_>, tmp: &str, name: &str, capacity: u64) -> Result<OwnedFd, Errno> {
    match rustix::fs::unlinkat(dir, tmp, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(e) => return Err(e),
    }
    let file = rustix::fs::openat(
        dir,
        tmp,
        OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o600),
    )?;
    // btrfs: overwrite in place instead of copy-on-write, so a flush writes no new extent.
    // Must be set while the file is empty; other filesystems do not know the flag.
    let _ = rustix::fs::ioctl_setflags(&file, rustix::fs::IFlags::NOCOW);
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < capacity {
        let n = zeros.len().min((capacity - at) as usize);
        write_all_at(file.as_fd(), &zeros[..n], at)?;
        at += n as u64;
    }
    write_all_at(file.as_fd(), &encode_header(1), slot(1))?;
    rustix::fs::fsync(&file)?;
    rustix::fs::renameat(dir, tmp, dir, name)?;
    rustix::fs::fsync(dir)?;
    Ok(file)
}

/// `syncfs`, then the header of `epoch` in its slot, flushed.
fn start_epoch(file: BorrowedFd<'_>, epoch: u64) -> Result<(), Errno> {
    rustix::fs::syncfs(file)?;
    write_all_at(file, &encode_header(epoch), slot(epoch))?;
    rustix::fs::fdatasync(file)
}

fn slot(epoch: u64) -> u64 {
    (epoch % 2) * HEADER_SLOT
}

fn encode_header(epoch: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&epoch.to_le_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

fn parse_header(h: &[u8]) -> Option<u64> {
    let (body, crc) = h.split_at(HEADER_LEN - 4);
    if &body[..8] != MAGIC || crc32fast::hash(body).to_le_bytes() != crc {
        return None;
    }
    Some(u64::from_le_bytes(body[8..16].try_into().ok()?))
}

/// The checksum a record carries: over its epoch, sequence number and payload.
fn record_crc(epoch: u64, seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&epoch.to_le_bytes());
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

fn encode_record(buf: &mut Vec<u8>, epoch: u64, seq: u64, payload: &[u8]) {
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&record_crc(epoch, seq, payload).to_le_bytes());
    buf.extend_from_slice(&epoch.to_le_bytes());
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(payload);
}

/// The payloads of `epoch`'s records at the start of `body`, how many bytes they take, and the
/// last sequence number. Stops at the first record that is not the next valid one.
fn parse_records(body: &[u8], epoch: u64) -> (Vec<Vec<u8>>, usize, u64) {
    let (mut out, mut at, mut seq) = (Vec::new(), 0usize, 0u64);
    while let Some(head) = body.get(at..at + RECORD_HEADER) {
        let word = |from: usize| u64::from_le_bytes(head[from..from + 8].try_into().unwrap_or_default());
        let half = |from: usize| u32::from_le_bytes(head[from..from + 4].try_into().unwrap_or_default());
        let (len, crc, rec_epoch, rec_seq) = (half(0) as usize, half(4), word(8), word(16));
        if len == 0 || len > MAX_PAYLOAD || rec_epoch != epoch || rec_seq != seq + 1 {
            break;
        }
        let Some(payload) = body.get(at + RECORD_HEADER..at + RECORD_HEADER + len) else {
            break;
        };
        if record_crc(rec_epoch, rec_seq, payload) != crc {
            break;
        }
        out.push(payload.to_vec());
        at += RECORD_HEADER + len;
        seq = rec_seq;
    }
    (out, at, seq)
}

fn write_all_at(fd: BorrowedFd<'_>, mut buf: &[u8], mut offset: u64) -> Result<(), Errno> {
    while !buf.is_empty() {
        match rustix::io::pwrite(fd, buf, offset) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_exact_at(fd: BorrowedFd<'_>, mut buf: &mut [u8], mut offset: u64) -> Result<(), JournalError> {
    while !buf.is_empty() {
        match rustix::io::pread(fd, &mut *buf, offset) {
            Ok(0) => return Err(JournalError::NotAJournal),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(io("read")(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::sync::{Arc, Barrier};

    fn dir() -> (tempfile::TempDir, OwnedFd) {
        let t = tempfile::tempdir().unwrap();
        let fd = rustix::fs::open(t.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        (t, fd)
    }

    #[test]
    fn appended_records_come_back_in_order_after_reopening_until_a_checkpoint() {
        let (_t, d) = dir();
        let (j, old) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        assert!(old.is_empty());
        assert!(matches!(
            j.append(d.as_fd(), b"early"),
            Err(JournalError::NotCheckpointed)
        ));
        j.checkpoint(d.as_fd()).unwrap();
        for i in 0..5u8 {
            j.append(d.as_fd(), &[i; 10]).unwrap();
        }
        drop(j);
        let (j, old) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        assert_eq!(old, (0..5u8).map(|i| vec![i; 10]).collect::<Vec<_>>());
        // Reopening reads the same records again until a checkpoint retires them.
        drop(j);
        let (j, old) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        assert_eq!(old.len(), 5);
        j.checkpoint(d.as_fd()).unwrap();
        j.append(d.as_fd(), b"six").unwrap();
        drop(j);
        let (_, old) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        assert_eq!(old, vec![b"six".to_vec()], "a checkpoint retires every earlier record");
    }

    #[test]
    fn a_full_file_checkpoints_and_keeps_only_what_follows() {
        let (_t, d) = dir();
        let (j, _) = Journal::open(d.as_fd(), "j", 24 << 10).unwrap();
        j.checkpoint(d.as_fd()).unwrap();
        // 20 KiB of record space; 1,000-byte records: twenty fit, the rest go to new epochs.
        for i in 0..50u32 {
            j.append(d.as_fd(), &[(i % 251) as u8; 1000]).unwrap();
        }
        let stats = j.stats();
        assert!(stats.checkpoints >= 2, "{stats:?}");
        drop(j);
        let (_, old) = Journal::open(d.as_fd(), "j", 24 << 10).unwrap();
        assert!(!old.is_empty() && old.len() <= 20, "{}", old.len());
        assert_eq!(old.last().unwrap(), &vec![49u8; 1000]);
    }

    #[test]
    fn a_torn_record_ends_the_journal_and_an_older_epoch_is_not_replayed() {
        let (t, d) = dir();
        let (j, _) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        j.checkpoint(d.as_fd()).unwrap();
        for i in 0..3u8 {
            j.append(d.as_fd(), &[i; 100]).unwrap();
        }
        drop(j);
        // Tear the second record: one flipped byte in its payload.
        let path = t.path().join("j");
        let mut bytes = std::fs::read(&path).unwrap();
        let second = RECORDS_START as usize + RECORD_HEADER + 100 + RECORD_HEADER + 50;
        bytes[second] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (j, old) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        assert_eq!(old, vec![vec![0u8; 100]]);
        // A checkpoint's new epoch does not read the previous epoch's records behind its own.
        j.checkpoint(d.as_fd()).unwrap();
        j.append(d.as_fd(), b"new").unwrap();
        drop(j);
        let (_, old) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        assert_eq!(old, vec![b"new".to_vec()]);
    }

    #[test]
    fn a_torn_header_falls_back_to_the_other_slot() {
        let (t, d) = dir();
        let (j, _) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        j.checkpoint(d.as_fd()).unwrap();
        j.append(d.as_fd(), b"epoch two").unwrap();
        drop(j);
        // A crash tore the next checkpoint's header write (epoch 3, slot 1): epoch 2 still stands.
        let path = t.path().join("j");
        let mut bytes = std::fs::read(&path).unwrap();
        let mut torn = encode_header(3);
        torn[17] ^= 1;
        let at = slot(3) as usize;
        bytes[at..at + HEADER_LEN].copy_from_slice(&torn);
        std::fs::write(&path, &bytes).unwrap();
        let (_, old) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        assert_eq!(old, vec![b"epoch two".to_vec()]);
    }

    #[test]
    fn garbage_is_not_a_journal_and_nothing_panics_on_hostile_bytes() {
        let (t, d) = dir();
        std::fs::write(t.path().join("j"), vec![0xA5u8; 9000]).unwrap();
        assert!(matches!(
            Journal::open(d.as_fd(), "j", 64 << 10),
            Err(JournalError::NotAJournal)
        ));
        // Valid header, then records claiming absurd lengths and sequence numbers.
        let mut bytes = vec![0u8; 64 << 10];
        bytes[512..512 + HEADER_LEN].copy_from_slice(&encode_header(1));
        for (i, b) in bytes[RECORDS_START as usize..].iter_mut().enumerate() {
            *b = (i * 7 % 256) as u8;
        }
        std::fs::write(t.path().join("k"), &bytes).unwrap();
        let (_, old) = Journal::open(d.as_fd(), "k", 64 << 10).unwrap();
        assert!(old.is_empty());
        std::fs::write(t.path().join("short"), b"HPPJRNL1").unwrap();
        assert!(Journal::open(d.as_fd(), "short", 64 << 10).is_err());
        // The last epoch there is: no checkpoint could follow it.
        let mut last = vec![0u8; 64 << 10];
        last[..HEADER_LEN].copy_from_slice(&encode_header(u64::MAX));
        std::fs::write(t.path().join("last"), &last).unwrap();
        assert!(matches!(
            Journal::open(d.as_fd(), "last", 64 << 10),
            Err(JournalError::NotAJournal)
        ));
        // Larger than any journal: not read into memory.
        let huge = std::fs::File::create(t.path().join("huge")).unwrap();
        huge.set_len(MAX_CAPACITY + 1).unwrap();
        assert!(matches!(
            Journal::open(d.as_fd(), "huge", 64 << 10),
            Err(JournalError::NotAJournal)
        ));
    }

    #[test]
    fn concurrent_appends_share_flushes_and_all_survive() {
        let (_t, d) = dir();
        let (j, _) = Journal::open(d.as_fd(), "j", 1 << 20).unwrap();
        j.checkpoint(d.as_fd()).unwrap();
        let (j, d) = (Arc::new(j), Arc::new(d));
        let start = Arc::new(Barrier::new(16));
        let threads: Vec<_> = (0..16u8)
            .map(|t| {
                let (j, d, start) = (j.clone(), d.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for i in 0..20u8 {
                        j.append(d.as_fd(), &[t, i]).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let stats = j.stats();
        assert!(stats.flushes < 320, "{stats:?} for 320 appends");
        assert_eq!(stats.records, 320);
        drop(j);
        let (_, old) = Journal::open(d.as_fd(), "j", 1 << 20).unwrap();
        let mut seen: Vec<_> = old.iter().map(|p| (p[0], p[1])).collect();
        seen.sort_unstable();
        let want: Vec<_> = (0..16u8).flat_map(|t| (0..20u8).map(move |i| (t, i))).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn records_handed_to_the_flusher_thread_become_durable_and_the_thread_ends_with_the_journal() {
        let (_t, d) = dir();
        let (j, _) = Journal::open(d.as_fd(), "j", 1 << 20).unwrap();
        j.checkpoint(d.as_fd()).unwrap();
        {
            // What a flush that ends with two records queued leaves behind.
            let mut st = j.shared.lock();
            st.queue.extend([b"one".to_vec(), b"two".to_vec()]);
            st.enqueued += 2;
            st.flushing = true;
            assert!(j.hand_off(&mut st, d.as_fd()));
        }
        // Queues behind the flusher (or leads, if it is already done) and returns once covered.
        j.append(d.as_fd(), b"three").unwrap();
        let stats = j.stats();
        assert_eq!(stats.handoffs, 1);
        assert!(stats.flushes >= 1, "{stats:?}");
        let shared = Arc::downgrade(&j.shared);
        drop(j);
        for _ in 0..1000 {
            if shared.strong_count() == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(shared.strong_count(), 0, "the flusher thread outlived its journal");
        let (_, old) = Journal::open(d.as_fd(), "j", 1 << 20).unwrap();
        assert_eq!(old, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
    }

    #[test]
    fn a_journal_that_cannot_be_made_leaves_nothing_behind() {
        let (t, d) = dir();
        std::fs::create_dir(t.path().join("j")).unwrap();
        // A directory where the journal should be: not a journal, and left alone.
        assert!(matches!(
            Journal::open(d.as_fd(), "j", 64 << 10),
            Err(JournalError::NotAJournal)
        ));
        // Too little room for the file: refused, and no half-made file stays.
        let small = t.path().join("small");
        std::fs::create_dir(&small).unwrap();
        if rustix::process::geteuid().is_root() {
            rustix::mount::mount(
                "tmpfs",
                &small,
                "tmpfs",
                rustix::mount::MountFlags::empty(),
                c"size=64k",
            )
            .unwrap();
        } else {
            rustix::fs::chmod(&small, Mode::from_raw_mode(0o500)).unwrap();
        }
        let small_fd = rustix::fs::open(&small, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let result = Journal::open(small_fd.as_fd(), "j", 1 << 20);
        let left = std::fs::read_dir(&small).unwrap().count();
        drop(small_fd);
        if rustix::process::geteuid().is_root() {
            rustix::mount::unmount(&small, rustix::mount::UnmountFlags::DETACH).unwrap();
        }
        assert!(matches!(result, Err(JournalError::CannotCreate(_))), "{result:?}");
        assert_eq!(left, 0);
    }

    #[test]
    fn a_journal_replaced_behind_its_back_is_not_written() {
        let (t, d) = dir();
        let (j, _) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        j.checkpoint(d.as_fd()).unwrap();
        j.append(d.as_fd(), b"one").unwrap();
        // Another journal now stands under the name (as when a filesystem is mounted over the
        // pool): it is neither written nor taken for the first.
        std::fs::rename(t.path().join("j"), t.path().join("old")).unwrap();
        let (other, _) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        assert!(matches!(j.append(d.as_fd(), b"two"), Err(JournalError::Replaced)));
        assert!(matches!(j.checkpoint(d.as_fd()), Err(JournalError::Replaced)));
        drop((j, other));
        let (_, records) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        assert!(records.is_empty());
        std::fs::rename(t.path().join("old"), t.path().join("j")).unwrap();
        let (_, records) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        assert_eq!(records, vec![b"one".to_vec()]);
    }

    /// A callback that sends the outcome (as a string, `ok` or the error) down a channel.
    fn reporting(tx: &std::sync::mpsc::Sender<(u8, String)>, tag: u8) -> Durable {
        let tx = tx.clone();
        Box::new(move |outcome: Result<(), JournalError>| {
            let _ = tx.send((tag, outcome.map_or_else(|e| e.to_string(), |()| "ok".to_owned())));
        })
    }

    #[test]
    fn records_appended_without_waiting_are_reported_durable_and_survive_mixed_with_waiting_ones() {
        let (_t, d) = dir();
        let (j, _) = Journal::open(d.as_fd(), "j", 1 << 20).unwrap();
        j.checkpoint(d.as_fd()).unwrap();
        let (j, d) = (Arc::new(j), Arc::new(d));
        let (tx, rx) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let (j, d, tx) = (j.clone(), d.clone(), tx.clone());
                std::thread::spawn(move || {
                    for i in 0..20u8 {
                        match t % 2 {
                            0 => j.append_then(d.as_fd(), &[t, i], reporting(&tx, t)).unwrap(),
                            _ => j.append(d.as_fd(), &[t, i]).unwrap(),
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(tx);
        let reports: Vec<_> = rx.iter().collect();
        assert_eq!(reports.len(), 80, "every callback is called once");
        assert!(reports.iter().all(|(_, r)| r == "ok"), "{reports:?}");
        drop(j);
        let (_, old) = Journal::open(d.as_fd(), "j", 1 << 20).unwrap();
        let mut seen: Vec<_> = old.iter().map(|p| (p[0], p[1])).collect();
        seen.sort_unstable();
        let want: Vec<_> = (0..8u8).flat_map(|t| (0..20u8).map(move |i| (t, i))).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn a_failed_flush_fails_every_record_waiting_for_it_and_every_later_append() {
        let (t, d) = dir();
        let (j, _) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        j.checkpoint(d.as_fd()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        j.shared.lock().flushing = true;
        // Queued behind a flush (held here): nothing is written yet.
        j.append_then(d.as_fd(), b"one", reporting(&tx, 1)).unwrap();
        j.append_then(d.as_fd(), b"two", reporting(&tx, 2)).unwrap();
        assert!(rx.try_recv().is_err());
        // The file is replaced before the queue is flushed: the flush refuses to write it.
        std::fs::rename(t.path().join("j"), t.path().join("old")).unwrap();
        std::fs::copy(t.path().join("old"), t.path().join("j")).unwrap();
        {
            let mut st = j.shared.lock();
            assert!(j.hand_off(&mut st, d.as_fd()));
        }
        let mut reports: Vec<_> = rx.iter().take(2).collect();
        reports.sort();
        assert_eq!(reports.iter().map(|(tag, _)| *tag).collect::<Vec<_>>(), [1, 2]);
        assert!(reports.iter().all(|(_, r)| r.contains("replaced")), "{reports:?}");
        let later = j.append_then(d.as_fd(), b"three", reporting(&tx, 3));
        assert!(matches!(later, Err(JournalError::Replaced)));
        assert!(matches!(j.append(d.as_fd(), b"four"), Err(JournalError::Replaced)));
    }

    #[test]
    fn oversized_and_empty_payloads_are_refused() {
        let (_t, d) = dir();
        let (j, _) = Journal::open(d.as_fd(), "j", 64 << 10).unwrap();
        j.checkpoint(d.as_fd()).unwrap();
        assert!(matches!(
            j.append(d.as_fd(), &vec![1; MAX_PAYLOAD + 1]),
            Err(JournalError::TooLarge(_))
        ));
        assert!(matches!(j.append(d.as_fd(), &[]), Err(JournalError::TooLarge(0))));
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the bytes, parsing ends inside them and returns only records that check out.
        #[test]
        fn parsing_any_bytes_stays_in_bounds(body in proptest::collection::vec(any::<u8>(), 0..4096), epoch in 0u64..4) {
            let (records, used, seq) = parse_records(&body, epoch);
            prop_assert!(used <= body.len());
            prop_assert_eq!(records.len() as u64, seq);
        }

        /// Records written by the encoder are read back exactly, and a cut anywhere keeps a prefix.
        #[test]
        fn encoded_records_round_trip_and_a_cut_keeps_a_prefix(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..200), 1..20),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut buf = Vec::new();
            for (i, p) in payloads.iter().enumerate() {
                encode_record(&mut buf, 7, i as u64 + 1, p);
            }
            let (records, used, _) = parse_records(&buf, 7);
            prop_assert_eq!(&records, &payloads);
            prop_assert_eq!(used, buf.len());
            let at = cut.index(buf.len());
            let (prefix, _, _) = parse_records(&buf[..at], 7);
            prop_assert_eq!(&prefix[..], &payloads[..prefix.len()]);
        }
    }
}
