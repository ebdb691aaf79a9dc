//! `ramdisk_error` / `ramdisk-error`: fail when IPA reports an error. Writes nothing to Ironic.
use serde_json::Value;

use super::Hook;
use crate::processing::data::{show, truthy};

/// Fails phase 1 with "Ramdisk reported error: ..." when `data.error` is truthy.
#[derive(Debug)]
pub(crate) struct RamdiskError;

impl Hook for RamdiskError {
    fn before_processing(&self, data: &mut Value) -> Result<(), String> {
        match data.get("error") {
            Some(error) if truthy(error) => Err(format!("Ramdisk reported error: {}", show(error))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::testdata;
    use serde_json::json;

    #[test]
    fn reports_the_ramdisk_error() {
        let mut data = testdata::ramdisk_error();
        let err = RamdiskError.before_processing(&mut data).expect_err("error");
        assert_eq!(
            err,
            "Ramdisk reported error: The following errors were encountered:\n\
             * failed to run hardware-detect utility: [Errno 2] No such file or directory: 'hardware-detect'"
        );
    }

    #[test]
    fn passes_without_an_error() {
        assert_eq!(RamdiskError.before_processing(&mut testdata::two_nics_two_disks()), Ok(()));
        assert_eq!(RamdiskError.before_processing(&mut json!({"error": ""})), Ok(()));
        assert_eq!(RamdiskError.before_processing(&mut json!({})), Ok(()));
        assert_eq!(RamdiskError.before_processing(&mut json!("not an object")), Ok(()));
    }
}
