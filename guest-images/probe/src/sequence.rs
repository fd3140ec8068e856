//! The frame generator's sequence numbers as frames arrive: frames the NIC dropped before the
//! probe took them (gaps: the generator outran the ring) apart from frames that came out of
//! order (a NIC or DMA bug). Only reordering fails the NIC section.

/// What the sequence numbers seen so far show.
#[derive(Clone, Copy, Default)]
pub struct SequenceCheck {
    expected: Option<u64>,
    /// Frames the sequence skipped.
    pub missing: u64,
    /// Frames whose number was below one already seen.
    pub reordered: u64,
}

impl SequenceCheck {
    /// A frame with sequence number `seq` arrived.
    pub fn saw(&mut self, seq: u64) {
        match self.expected {
            Some(next) if seq < next => self.reordered += 1,
            Some(next) => {
                self.missing += seq - next;
                self.expected = Some(seq.saturating_add(1));
            }
            None => self.expected = Some(seq.saturating_add(1)),
        }
    }

    /// Whether every frame came in order (gaps allowed).
    pub fn in_order(&self) -> bool {
        self.reordered == 0
    }
}
