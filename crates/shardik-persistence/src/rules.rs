//! The write checks every backend applies the same way.

use crate::error::StoreError;
use crate::record::Incarnation;

/// Checks a write against the stream's stored position and newest writer: an older writer
/// is fenced out first, then the position must match exactly.
pub(crate) fn check_write(
    persistence_id: &str,
    stored: u64,
    stored_writer: Incarnation,
    expected: u64,
    writer: Incarnation,
) -> Result<(), StoreError> {
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
}
