//! [`Fairness`]: who goes first when readers and writers of one `RwLock` contend.

/// Who goes first when the readers and writers of one [`RwLock`](crate::RwLock) contend, in
/// every process that uses the lock; set with [`RwLock::fairness`](crate::RwLock::fairness).
///
/// Whatever the policy, a writer holds alone and readers share; the policy decides only the
/// order in which the waiting ones get in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fairness {
    /// Phase-fair (the default), in the sense of Brandenburg and Anderson's reader–writer
    /// locks: reads and writes take turns.
    ///
    /// A writer refused by live readers leaves a *write intent*, as under
    /// [`WritersFirst`](Self::WritersFirst): reads that arrive after it wait for its write (in
    /// every process, also reads that would join a shared read lease in this one). A read
    /// refused while a writer holds or waits, and that waits (`try_read_for`, the layer's
    /// `max_wait`), is noted as waiting; when the write ends, every read noted then is let in
    /// before the next writer (a *read phase*, over once they all came in, or after 500 ms, the
    /// TTL if shorter, for those that never came back). So no writer waits longer than the
    /// reads in flight when it came (and one read phase), and no read waits longer than one
    /// write.
    #[default]
    PhaseFair,
    /// Readers first, the old default: a writer is refused as long as any reader lease
    /// lives, so overlapping readers can keep it out for good. Reads are never held up by a
    /// waiting writer.
    ReadersFirst,
    /// Writers first, the old `writer_preferred()`: a writer refused by live readers leaves a
    /// write intent while which *every* new reader is refused, with the intent's remaining time
    /// as its `retry_after`; the readers already in finish, and the writer gets in. A stream of
    /// writers can keep readers out.
    WritersFirst,
}

impl Fairness {
    /// Whether a writer refused by live readers leaves a write intent that holds new readers
    /// off: under [`PhaseFair`](Self::PhaseFair) and [`WritersFirst`](Self::WritersFirst).
    pub const fn leaves_write_intent(self) -> bool {
        !matches!(self, Fairness::ReadersFirst)
    }

    /// Whether the reads that waited for a write go before the next writer:
    /// [`PhaseFair`](Self::PhaseFair) only.
    pub const fn has_read_phases(self) -> bool {
        matches!(self, Fairness::PhaseFair)
    }

    /// `"phase_fair"`, `"readers_first"` or `"writers_first"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Fairness::PhaseFair => "phase_fair",
            Fairness::ReadersFirst => "readers_first",
            Fairness::WritersFirst => "writers_first",
        }
    }
}
