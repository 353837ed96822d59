//! The stream positions a PostgreSQL writer lane has committed itself, so that an append
//! continuing one of them needs no read.
//!
//! Why a remembered position is enough: if this lane committed event `n` of a stream with
//! writer `w`, and an append expects position `n` with a writer not older than `w`, then
//! either the stream still ends at `n` (its highest row is the one the lane wrote, written by
//! `w`, so the append passes every check) or someone appended since, in which case the
//! stream holds a row after `n + 1` or at it, and the insert is refused by the journal's
//! primary key: directly at `n + 1`, or because the insert statement writes a row at the
//! position of any later row it finds (see `sql.rs`: deleting events may have removed row
//! `n + 1`, never the stream's highest). The writer then forgets the batch's positions and
//! runs it again with positions read from the database, which refuses the stale append
//! with the precise error. Nothing else moves a position: rows are never rewritten.

use compact_str::CompactString;

use crate::batch::{Position, RememberedPositions as Map};
use crate::record::Incarnation;

type Key = CompactString;

/// Positions committed by one lane, in two generations: `recent` takes every position
/// committed or confirmed; when it holds half the capacity it becomes `older` (the previous
/// `older` is forgotten) and a fresh `recent` starts. A position found in `older` moves back
/// to `recent`. So at most `capacity` positions are held (rounded up to an even number), and
/// what is forgotten is what was not used during a whole generation: least recently used
/// first, to within a generation, without the linked list (a separate allocation per entry)
/// an exact LRU keeps.
pub(super) struct Known {
    /// Positions per generation (half the capacity, rounded up); 0 remembers none.
    generation: usize,
    recent: Map,
    older: Map,
    /// The newest pooled connection this lane has written on (the pool numbers its
    /// connections in the order it opened them).
    newest_connection: Option<deadpool_postgres::ObjectId>,
}

impl Known {
    /// Remembers up to `capacity` streams (0: none, every append reads its position).
    pub(super) fn new(capacity: usize) -> Known {
        Known {
            generation: capacity.div_ceil(2),
            recent: Map::default(),
            older: Map::default(),
            newest_connection: None,
        }
    }

    /// The lane is about to write on pooled connection `id`. A connection opened after every
    /// one the lane has written on may reach another server than they did (the server
    /// failed over to a replica that lacks the last commits, or was restored from a backup),
    /// where the positions this lane committed may not hold: an append trusted to continue
    /// one would then leave a gap in its stream that no key refuses. So everything is
    /// forgotten, and the streams' positions are read afresh as they are written.
    pub(super) fn connection(&mut self, id: deadpool_postgres::ObjectId) {
        if self.newest_connection.is_some_and(|newest| id <= newest) {
            return;
        }
        self.newest_connection = Some(id);
        self.recent.clear();
        self.older.clear();
    }

    /// The remembered position of `persistence_id` if it proves that an append expecting
    /// `expected` by `writer` continues the stream (see the module docs).
    pub(super) fn confirms(
        &mut self,
        persistence_id: &str,
        expected: u64,
        writer: Incarnation,
    ) -> Option<Position> {
        let known = match self.recent.get(persistence_id) {
            Some(known) => *known,
            None => {
                let (key, known) = self.older.remove_entry(persistence_id)?;
                self.insert(key, known);
                known
            }
        };
        (known.seq_nr == expected && writer >= known.writer).then_some(known)
    }

    /// Records a position this lane has committed.
    pub(super) fn committed(&mut self, persistence_id: &str, position: Position) {
        if self.generation == 0 {
            return;
        }
        match self.recent.get_mut(persistence_id) {
            Some(known) => *known = position,
            None => {
                let key = match self.older.remove_entry(persistence_id) {
                    Some((key, _)) => key,
                    None => Key::from(persistence_id),
                };
                self.insert(key, position);
            }
        }
    }

    /// Forgets `persistence_id` (its batch failed: what it holds is unknown).
    pub(super) fn forget(&mut self, persistence_id: &str) {
        self.recent.remove(persistence_id);
        self.older.remove(persistence_id);
    }

    /// Puts a position that is in neither generation into `recent`, starting a new
    /// generation first if `recent` is full.
    fn insert(&mut self, key: Key, position: Position) {
        if self.recent.len() >= self.generation {
            // The older generation goes; its table is reused for the new one.
            std::mem::swap(&mut self.recent, &mut self.older);
            self.recent.clear();
        }
        self.recent.insert(key, position);
    }

    /// Positions held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.recent.len() + self.older.len()
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
        assert_eq!(none.len(), 0);
    }

    #[test]
    fn never_more_than_capacity_and_what_is_used_stays() {
        let mut known = Known::new(10);
        known.committed("hot", at(1, 1));
        for i in 0..1_000u64 {
            known.committed(&format!("stream-{i}"), at(i + 1, 1));
            assert!(known.len() <= 10, "{} held after {i}", known.len());
            // Used every few commits: never a whole generation (5) without use.
            if i % 3 == 0 {
                assert_eq!(known.confirms("hot", 1, 1), Some(at(1, 1)), "after {i}");
            }
        }
        // The most recent generation is all there; the first streams are long gone.
        assert!(known.confirms("stream-999", 1000, 1).is_some());
        assert!(known.confirms("stream-998", 999, 1).is_some());
        assert!(known.confirms("stream-0", 1, 1).is_none());
        // Committing a stream the older generation holds moves it, with its new position, to
        // the recent one.
        let mut known = Known::new(4);
        for id in ["a", "b", "c"] {
            known.committed(id, at(1, 1));
        }
        known.committed("a", at(2, 1));
        assert_eq!(known.confirms("a", 2, 1), Some(at(2, 1)));
        assert_eq!(known.confirms("a", 1, 1), None, "the old position is gone");
        assert!(known.len() <= 4);
    }

    #[test]
    fn forgetting_drops_a_position_from_either_generation() {
        let mut known = Known::new(2);
        known.committed("a", at(1, 1));
        known.committed("b", at(1, 1)); // "a" is in the older generation now
        known.forget("a");
        known.forget("b");
        assert_eq!(known.confirms("a", 1, 1), None);
        assert_eq!(known.confirms("b", 1, 1), None);
        assert_eq!(known.len(), 0);
    }

    #[test]
    fn long_ids_are_remembered_too() {
        let long = "x".repeat(200);
        let mut known = Known::new(8);
        known.committed(&long, at(5, 2));
        assert_eq!(known.confirms(&long, 5, 2), Some(at(5, 2)));
    }
}
