//! The rule that keeps a RemoveAll from wiping a Put that committed while it ran.

use crate::wire::encode::DEFAULT_TENANT;
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

/// The RemoveAll scans the publishing thread has seen begin, and where in the stream each
/// tenant last gained a medium.
///
/// Positions count records in the order the publishing thread takes them off the queue,
/// which is the order of the stream, so "a call that adds a medium reached the publisher
/// after the scan began" is an exact comparison of two positions and needs no lock on the
/// callers' side. State is per tenant and per scan, never per object, and bounded: past
/// [`ScanLog::MAX_SCANS`] scans or [`ScanLog::MAX_TENANTS`] tenants the oldest knowledge is
/// forgotten, and a `cleared` that would need it is suppressed, which is always safe.
#[derive(Debug, Default)]
pub(crate) struct ScanLog {
    position: u64,
    scans: VecDeque<(u64, u64)>,
    last_added: HashMap<u64, u64>,
    /// Scans that began before this position may have lost tenants from `last_added`.
    forgotten_before: u64,
}

impl ScanLog {
    pub(crate) const MAX_SCANS: usize = 64;
    pub(crate) const MAX_TENANTS: usize = 1 << 16;

    /// Marks the position of every record the thread takes off the queue.
    pub(crate) fn advance(&mut self) {
        self.position += 1;
    }

    pub(crate) fn begin(&mut self, scan: u64) {
        if self.scans.len() == Self::MAX_SCANS {
            self.scans.pop_front();
        }
        self.scans.push_back((scan, self.position));
    }

    pub(crate) fn medium_added(&mut self, tenant: &[u8]) {
        if self.scans.is_empty() {
            return; // no RemoveAll has begun: nothing to protect
        }
        if self.last_added.len() == Self::MAX_TENANTS {
            self.last_added.clear();
            self.forgotten_before = self.position;
        }
        self.last_added.insert(tenant_hash(tenant), self.position);
    }

    /// Whether `tenant` may be cleared for `scan`: the scan is known and no medium was added
    /// to the tenant since it began.
    pub(crate) fn may_clear(&self, scan: u64, tenant: &[u8]) -> bool {
        let Some(&(_, began)) = self.scans.iter().find(|(id, _)| *id == scan) else {
            return false;
        };
        began >= self.forgotten_before
            && self
                .last_added
                .get(&tenant_hash(tenant))
                .is_none_or(|&added| added < began)
    }
}

/// 64 bits of SipHash: a collision only suppresses a `cleared`.
fn tenant_hash(tenant: &[u8]) -> u64 {
    let tenant = if tenant.is_empty() {
        DEFAULT_TENANT
    } else {
        tenant
    };
    let mut hasher = DefaultHasher::new();
    tenant.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_with_scan(scan: u64) -> ScanLog {
        let mut log = ScanLog::default();
        log.advance();
        log.begin(scan);
        log
    }

    #[test]
    fn a_medium_added_after_the_scan_blocks_only_its_tenant() {
        let mut log = log_with_scan(1);
        log.advance();
        log.medium_added(b"a");
        assert!(!log.may_clear(1, b"a"));
        assert!(log.may_clear(1, b"b"));
    }

    #[test]
    fn a_medium_added_before_the_scan_does_not_block() {
        let mut log = log_with_scan(1);
        log.advance();
        log.medium_added(b"a");
        log.advance();
        log.begin(2);
        assert!(log.may_clear(2, b"a"));
        assert!(!log.may_clear(1, b"a"));
    }

    #[test]
    fn empty_tenant_is_the_default_tenant() {
        let mut log = log_with_scan(1);
        log.advance();
        log.medium_added(b"");
        assert!(!log.may_clear(1, b"default"));
    }

    #[test]
    fn unknown_and_forgotten_scans_never_clear() {
        let mut log = log_with_scan(1);
        assert!(!log.may_clear(7, b"a"));
        for scan in 2..=(ScanLog::MAX_SCANS as u64 + 1) {
            log.begin(scan);
        }
        assert!(!log.may_clear(1, b"a"), "the oldest scan was forgotten");
        assert!(log.may_clear(2, b"a"));
    }

    #[test]
    fn too_many_tenants_forget_safely() {
        let mut log = log_with_scan(1);
        for i in 0..=ScanLog::MAX_TENANTS {
            log.advance();
            log.medium_added(&i.to_le_bytes());
        }
        assert!(!log.may_clear(1, b"never-added"));
        log.advance();
        log.begin(2);
        assert!(log.may_clear(2, b"never-added"));
    }
}
