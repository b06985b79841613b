//! [`SharedReads`]' tests: counting, joining, and the races at the ends of a share.
