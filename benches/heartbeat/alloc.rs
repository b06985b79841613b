//! The benchmark's allocator: the system allocator, plus counts of the bytes and blocks alive
//! (by size class, for `HEARTBEAT_DIAG`), to measure memory per lease more finely than the
//! resident set and to tell what each held request keeps.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Size classes of 16 bytes up to 4 KiB; the last one holds every larger block.
const CLASSES: usize = 257;

pub(crate) struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
/// The most `LIVE_BYTES` reached since the last [`Live::now`].
static PEAK_BYTES: AtomicIsize = AtomicIsize::new(0);
static LIVE_BLOCKS: [AtomicIsize; CLASSES] = [const { AtomicIsize::new(0) }; CLASSES];

fn class(size: usize) -> usize {
    size.div_ceil(16).min(CLASSES - 1)
}

fn count(size: usize, blocks: isize) {
    let bytes = size as isize * blocks;
    let live = LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if blocks > 0 {
        PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
    }
    LIVE_BLOCKS[class(size)].fetch_add(blocks, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size(), 1);
        // SAFETY: the caller upholds `alloc`'s contract, which is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(layout.size(), -1);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(layout.size(), -1);
        count(new_size, 1);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What is alive at one moment.
#[derive(Clone)]
pub(crate) struct Live {
    pub(crate) bytes: isize,
    /// The most bytes alive at once since the previous snapshot.
    pub(crate) peak: isize,
    blocks: Vec<isize>,
}

impl Live {
    pub(crate) fn now() -> Self {
        let bytes = LIVE_BYTES.load(Ordering::SeqCst);
        Live {
            bytes,
            peak: PEAK_BYTES.swap(bytes, Ordering::SeqCst),
            blocks: LIVE_BLOCKS
                .iter()
                .map(|n| n.load(Ordering::SeqCst))
                .collect(),
        }
    }

    /// Blocks allocated since `before` and still alive, per lease, by size class: the classes
    /// where at least one block in twenty leases is left, as `(up to bytes, blocks per lease)`.
    pub(crate) fn blocks_since(&self, before: &Live, leases: usize) -> Vec<(usize, f64)> {
        let n = leases as f64;
        (0..CLASSES)
            .map(|c| (c * 16, (self.blocks[c] - before.blocks[c]) as f64 / n))
            .filter(|(_, per_lease)| per_lease.abs() >= 0.05)
            .collect()
    }
}

/// Blocks per lease by size class, as one line for the report.
pub(crate) fn describe(blocks: &[(usize, f64)]) -> String {
    let total: f64 = blocks.iter().map(|(_, n)| n).sum();
    let classes: Vec<String> = blocks
        .iter()
        .map(|(size, n)| format!("{n:.2} × ≤{size} B"))
        .collect();
    format!("{total:.2} blocks: {}", classes.join(", "))
}
