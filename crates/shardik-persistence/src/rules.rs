//! The write checks every backend applies the same way.

use crate::error::StoreError;
use crate::record::Incarnation;

/// The highest writer incarnation a store keeps: SQLite and PostgreSQL store numbers as
/// signed 64-bit integers, and one above this reads back negative (as corrupt).
pub(crate) const MAX_INCARNATION: Incarnation = i64::MAX as Incarnation;

/// Refuses a writer incarnation above [`MAX_INCARNATION`]: stored, it would read back as
/// corrupt, and the next owner could not take the stream over.
pub(crate) fn check_writer(persistence_id: &str, writer: Incarnation) -> Result<(), StoreError> {
    if writer > MAX_INCARNATION {
        return Err(StoreError::Backend(format!(
            "writer incarnation {writer} of {persistence_id} is above {MAX_INCARNATION} \
             (i64::MAX), the highest a store keeps: nothing was written"
        )));
    }
    Ok(())
}

/// Checks a write against the stream's stored position and newest writer: a writer above
/// [`MAX_INCARNATION`] is refused, an older writer is fenced out, then the position must
/// match exactly.
pub(crate) fn check_write(
    persistence_id: &str,
    stored: u64,
    stored_writer: Incarnation,
    expected: u64,
    writer: Incarnation,
) -> Result<(), StoreError> {
    check_writer(persistence_id, writer)?;
    if writer < stored_writer {
        return Err(StoreError::Fenced {
            persistence_id: persistence_id.to_string(),
            writer,
            current: stored_writer,
        });
    }
    if stored != expected {
        return Err(StoreError::Conflict {
            persistence_id: persistence_id.to_string(),
            expected,
            actual: stored,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fencing_wins_over_position_and_equal_writers_pass() {
        assert!(matches!(
            check_write("p", 3, 5, 2, 4),
            Err(StoreError::Fenced {
                writer: 4,
                current: 5,
                ..
            })
        ));
        assert!(matches!(
            check_write("p", 3, 5, 2, 5),
            Err(StoreError::Conflict {
                expected: 2,
                actual: 3,
                ..
            })
        ));
        assert_eq!(check_write("p", 3, 5, 3, 5), Ok(()));
        assert_eq!(check_write("p", 3, 5, 3, 6), Ok(()));
    }

    #[test]
    fn a_writer_above_i64_max_is_refused_before_anything_else() {
        assert_eq!(check_write("p", 0, 0, 0, MAX_INCARNATION), Ok(()));
        for writer in [MAX_INCARNATION + 1, u64::MAX] {
            match check_write("p", 3, 5, 2, writer) {
                Err(StoreError::Backend(why)) => {
                    assert!(
                        why.contains(&format!("writer incarnation {writer} of p")),
                        "{why}"
                    )
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
