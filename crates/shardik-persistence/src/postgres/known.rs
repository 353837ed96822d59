//! The stream positions a PostgreSQL writer lane has committed itself, so that an append
//! continuing one of them needs no read.
//!
//! Why a remembered position is enough: if this lane committed event `n` of a stream with
//! writer `w`, and an append expects position `n` with a writer not older than `w`, then
//! either the stream still ends at `n` (its highest row is the one the lane wrote, written by
//! `w`, so the append passes every check) or someone appended since, in which case row
//! `n + 1` exists and the journal's primary key refuses the insert. The writer then forgets
//! the batch's positions and runs it again with positions read from the database, which
//! refuses the stale append with the precise error. Nothing else moves a position: rows are
//! never rewritten, and deleting events keeps the highest row. (Rows deleted by hand, outside
//! the store, break that assumption; `known_positions: 0` turns remembering off.)

use std::num::NonZeroUsize;

use lru::LruCache;

use crate::batch::Position;
use crate::record::Incarnation;

/// Positions committed by one lane, least recently used forgotten first.
pub(super) struct Known {
    positions: Option<LruCache<String, Position>>,
}

impl Known {
    /// Remembers up to `capacity` streams (0: none, every append reads its position).
    pub(super) fn new(capacity: usize) -> Known {
        Known {
            positions: NonZeroUsize::new(capacity).map(LruCache::new),
        }
    }

    /// The remembered position of `persistence_id` if it proves that an append expecting
    /// `expected` by `writer` continues the stream (see the module docs).
    pub(super) fn confirms(
        &mut self,
        persistence_id: &str,
        expected: u64,
        writer: Incarnation,
    ) -> Option<Position> {
        let known = *self.positions.as_mut()?.get(persistence_id)?;
        (known.seq_nr == expected && writer >= known.writer).then_some(known)
    }

    /// Records a position this lane has committed.
    pub(super) fn committed(&mut self, persistence_id: &str, position: Position) {
        if let Some(positions) = &mut self.positions {
            match positions.get_mut(persistence_id) {
                Some(known) => *known = position,
                None => {
                    positions.put(persistence_id.to_string(), position);
                }
            }
        }
    }

    /// Forgets `persistence_id` (its batch failed: what it holds is unknown).
    pub(super) fn forget(&mut self, persistence_id: &str) {
        if let Some(positions) = &mut self.positions {
            positions.pop(persistence_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seq_nr: u64, writer: Incarnation) -> Position {
        Position { seq_nr, writer }
    }

    #[test]
    fn only_an_exact_continuation_by_a_writer_not_older_is_confirmed() {
        let mut known = Known::new(8);
        assert_eq!(known.confirms("a", 0, 1), None, "nothing remembered yet");
        known.committed("a", at(3, 5));
        assert_eq!(known.confirms("a", 3, 5), Some(at(3, 5)));
        assert_eq!(known.confirms("a", 3, 6), Some(at(3, 5)), "a newer writer");
        assert_eq!(known.confirms("a", 3, 4), None, "an older writer reads");
        assert_eq!(known.confirms("a", 2, 5), None, "behind: reads");
        assert_eq!(known.confirms("a", 4, 5), None, "ahead: reads");
        known.committed("a", at(4, 6));
        assert_eq!(known.confirms("a", 4, 6), Some(at(4, 6)));
        known.forget("a");
        assert_eq!(known.confirms("a", 4, 6), None);
    }

    #[test]
    fn capacity_bounds_what_is_remembered() {
        let mut known = Known::new(2);
        known.committed("a", at(1, 1));
        known.committed("b", at(1, 1));
        assert!(
            known.confirms("a", 1, 1).is_some(),
            "a is now the most recent"
        );
        known.committed("c", at(1, 1));
        assert!(
            known.confirms("b", 1, 1).is_none(),
            "b was least recently used"
        );
        assert!(known.confirms("a", 1, 1).is_some());
        assert!(known.confirms("c", 1, 1).is_some());

        let mut none = Known::new(0);
        none.committed("a", at(1, 1));
        assert_eq!(none.confirms("a", 1, 1), None);
    }
}
