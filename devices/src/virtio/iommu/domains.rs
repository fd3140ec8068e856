//! The virtio-iommu's address spaces: endpoints, domains and their mappings, with the request
//! semantics of virtio 1.2 section 5.13.6 and the translation the IOMMU performs for DMA.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use vm_device::dma::DmaMapListener;

/// Request status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// Virtio communication error.
    IoErr = 1,
    /// Unsupported request.
    Unsupp = 2,
    /// Internal device error (e.g. a listener could not mirror a mapping).
    DevErr = 3,
    /// Invalid parameters.
    Inval = 4,
    /// Out-of-range parameters.
    Range = 5,
    /// Entry not found.
    NoEnt = 6,
    /// Bad address.
    Fault = 7,
    /// Insufficient resources.
    NoMem = 8,
}

/// MAP flag: reads allowed.
pub const MAP_F_READ: u32 = 1 << 0;
/// MAP flag: writes allowed.
pub const MAP_F_WRITE: u32 = 1 << 1;
/// MAP flag: MMIO memory type.
pub const MAP_F_MMIO: u32 = 1 << 2;
/// ATTACH flag: a bypass domain.
pub const ATTACH_F_BYPASS: u32 = 1 << 0;

/// One mapping, `[start, end]` inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mapping {
    /// First IOVA.
    pub start: u64,
    /// Last IOVA (inclusive).
    pub end: u64,
    /// Guest-physical address of `start`.
    pub gpa: u64,
    /// MAP flags.
    pub flags: u32,
}

impl Mapping {
    /// Length in bytes.
    pub fn size(&self) -> u64 {
        self.end - self.start + 1
    }
}

#[derive(Debug, Default)]
struct Domain {
    bypass: bool,
    endpoints: BTreeSet<u32>,
    mappings: BTreeMap<u64, Mapping>,
}

/// Limits the device enforces.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Mapping granularity (the lowest bit of page_size_mask).
    pub granule: u64,
    /// Inclusive IOVA range.
    pub input_range: (u64, u64),
    /// Inclusive domain ID range.
    pub domain_range: (u32, u32),
    /// Most mappings per domain.
    pub max_mappings: usize,
    /// Reserved IOVA ranges, inclusive (the MSI doorbell window).
    pub reserved: Vec<(u64, u64)>,
    /// Guest-physical ranges a mapping may point at, `[start, end)`.
    pub guest_ram: Vec<(u64, u64)>,
}

/// What a DMA access wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The device reads memory.
    Read,
    /// The device writes memory.
    Write,
}

/// Why a DMA access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The endpoint is not attached and not in bypass.
    NotAttached,
    /// Nothing is mapped at the address.
    Unmapped,
    /// The mapping does not allow the access.
    Permission,
}

/// The endpoints, domains and mappings as a snapshot keeps them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AddressSpacesState {
    /// Each endpoint and the domain it is attached to.
    pub endpoints: Vec<(u32, Option<u32>)>,
    /// Each domain.
    pub domains: Vec<DomainState>,
    /// The `bypass` config field.
    pub bypass: bool,
}

/// A domain as a snapshot keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DomainState {
    /// Its ID.
    pub id: u32,
    /// Whether it is a bypass domain.
    pub bypass: bool,
    /// Its mappings.
    pub mappings: Vec<Mapping>,
}

/// Endpoints, domains and mappings.
pub struct AddressSpaces {
    limits: Limits,
    /// Endpoint ID -> attached domain.
    endpoints: BTreeMap<u32, Option<u32>>,
    domains: BTreeMap<u32, Domain>,
    listeners: BTreeMap<u32, Arc<dyn DmaMapListener>>,
    /// Config field `bypass`: unattached endpoints bypass translation.
    bypass: bool,
}

/// The effect of a successful request, for accounting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Effect {
    /// Mappings added.
    pub mapped: u64,
    /// Bytes mapped.
    pub mapped_bytes: u64,
    /// Mappings removed.
    pub unmapped: u64,
    /// Bytes unmapped.
    pub unmapped_bytes: u64,
    /// Mappings added that let the device write (`MAP_F_WRITE`: RX buffers); the rest of
    /// `mapped` it may only read (TX buffers).
    pub mapped_writable: u64,
    /// Where in guest memory the added mapping points (its guest-physical start).
    pub mapped_gpa: u64,
}

impl AddressSpaces {
    /// Address spaces for `endpoints` (the endpoint IDs behind this IOMMU).
    pub fn new(limits: Limits, endpoints: impl IntoIterator<Item = u32>, bypass: bool) -> Self {
        AddressSpaces {
            limits,
            endpoints: endpoints.into_iter().map(|ep| (ep, None)).collect(),
            domains: BTreeMap::new(),
            listeners: BTreeMap::new(),
            bypass,
        }
    }

    /// Returns to the reset state: no endpoint attached, no domain.
    pub fn reset(&mut self) {
        let detached: Vec<(u32, u32)> =
            self.endpoints.iter().filter_map(|(&ep, &domain)| domain.map(|d| (ep, d))).collect();
        for (ep, domain) in detached {
            self.detach_endpoint(ep, domain);
        }
    }

    /// The endpoints, domains and mappings, as a snapshot keeps them.
    pub fn state(&self) -> AddressSpacesState {
        AddressSpacesState {
            endpoints: self.endpoints.iter().map(|(&ep, &domain)| (ep, domain)).collect(),
            domains: self
                .domains
                .iter()
                .map(|(&id, d)| DomainState { id, bypass: d.bypass, mappings: d.mappings.values().copied().collect() })
                .collect(),
            bypass: self.bypass,
        }
    }

    /// Puts back a state from [`AddressSpaces::state`] of an IOMMU in front of the same
    /// endpoints; the listeners (passed-through devices) see their endpoints' new bypass state
    /// and mappings.
    pub fn restore(&mut self, state: &AddressSpacesState) -> Result<(), String> {
        let saved: BTreeSet<u32> = state.endpoints.iter().map(|e| e.0).collect();
        if saved.iter().ne(self.endpoints.keys()) {
            return Err(format!("endpoints {saved:?} saved, this IOMMU has {:?}", self.endpoints.keys()));
        }
        let mut domains = BTreeMap::new();
        for saved in &state.domains {
            let mappings = saved.mappings.iter().map(|m| (m.start, *m)).collect();
            domains.insert(saved.id, Domain { bypass: saved.bypass, endpoints: BTreeSet::new(), mappings });
        }
        for &(endpoint, domain) in &state.endpoints {
            if let Some(id) = domain {
                let domain = domains.get_mut(&id).ok_or(format!("endpoint {endpoint} in domain {id}, not saved"))?;
                domain.endpoints.insert(endpoint);
            }
        }
        let listening: Vec<(u32, bool)> = self.listeners.keys().map(|&ep| (ep, self.in_bypass(ep))).collect();
        self.endpoints = state.endpoints.iter().copied().collect();
        self.domains = domains;
        self.bypass = state.bypass;
        for (endpoint, was_bypass) in listening {
            if self.in_bypass(endpoint) != was_bypass {
                self.notify_bypass(endpoint, !was_bypass);
            }
            let (Some(listener), Some(domain)) = (self.listeners.get(&endpoint), self.domain_of(endpoint)) else {
                continue;
            };
            for m in self.domains[&domain].mappings.values() {
                if let Err(e) = listener.map(m.start, m.gpa, m.size(), m.flags & MAP_F_WRITE != 0) {
                    tracing::warn!("endpoint {endpoint}: replaying a restored mapping failed: {e}");
                }
            }
        }
        Ok(())
    }

    /// Routes the maps and unmaps affecting `endpoint` to `listener`.
    pub fn set_listener(&mut self, endpoint: u32, listener: Arc<dyn DmaMapListener>) {
        self.listeners.insert(endpoint, listener);
    }

    /// Stops routing `endpoint`'s maps and unmaps anywhere (its device left the guest).
    pub fn remove_listener(&mut self, endpoint: u32) {
        self.listeners.remove(&endpoint);
    }

    /// Whether `endpoint` exists.
    pub fn has_endpoint(&self, endpoint: u32) -> bool {
        self.endpoints.contains_key(&endpoint)
    }

    /// The domain `endpoint` is attached to.
    pub fn domain_of(&self, endpoint: u32) -> Option<u32> {
        self.endpoints.get(&endpoint).copied().flatten()
    }

    /// Live mappings over all domains.
    pub fn live_mappings(&self) -> u64 {
        self.domains.values().map(|d| d.mappings.len() as u64).sum()
    }

    /// ATTACH.
    pub fn attach(&mut self, domain: u32, endpoint: u32, flags: u32, bypass_config: bool) -> Status {
        let known_flags = if bypass_config { ATTACH_F_BYPASS } else { 0 };
        if flags & !known_flags != 0 {
            return Status::Inval;
        }
        if !self.endpoints.contains_key(&endpoint) {
            return Status::NoEnt;
        }
        if domain < self.limits.domain_range.0 || domain > self.limits.domain_range.1 {
            return Status::Range;
        }
        let bypass = flags & ATTACH_F_BYPASS != 0;
        if let Some(existing) = self.domains.get(&domain)
            && existing.bypass != bypass
        {
            return Status::Inval;
        }
        if let Some(old) = self.domain_of(endpoint) {
            if old == domain {
                return Status::Ok;
            }
            self.detach_endpoint(endpoint, old);
        }
        let was_bypass = self.in_bypass(endpoint);
        let entry = self.domains.entry(domain).or_insert_with(|| Domain { bypass, ..Domain::default() });
        entry.endpoints.insert(endpoint);
        self.endpoints.insert(endpoint, Some(domain));
        if was_bypass != bypass {
            self.notify_bypass(endpoint, bypass);
        }
        // A listener joining a domain sees the mappings it already has.
        if let Some(listener) = self.listeners.get(&endpoint) {
            for m in self.domains[&domain].mappings.values() {
                if let Err(e) = listener.map(m.start, m.gpa, m.size(), m.flags & MAP_F_WRITE != 0) {
                    tracing::warn!("endpoint {endpoint}: replaying a mapping at attach failed: {e}");
                }
            }
        }
        Status::Ok
    }

    fn detach_endpoint(&mut self, endpoint: u32, domain: u32) {
        if let Some(listener) = self.listeners.get(&endpoint)
            && let Some(d) = self.domains.get(&domain)
        {
            for m in d.mappings.values() {
                if let Err(e) = listener.unmap(m.start, m.size()) {
                    tracing::warn!("endpoint {endpoint}: unmapping at detach failed: {e}");
                }
            }
        }
        let was_bypass = self.in_bypass(endpoint);
        self.endpoints.insert(endpoint, None);
        if let Some(d) = self.domains.get_mut(&domain) {
            d.endpoints.remove(&endpoint);
            if d.endpoints.is_empty() {
                // The last endpoint left: the domain and its mappings cease to exist.
                self.domains.remove(&domain);
            }
        }
        if was_bypass != self.bypass {
            self.notify_bypass(endpoint, self.bypass);
        }
    }

    /// Whether `endpoint` is in bypass mode (unattached with `bypass` set, or in a bypass domain).
    pub fn in_bypass(&self, endpoint: u32) -> bool {
        match self.endpoints.get(&endpoint) {
            Some(Some(domain)) => self.domains.get(domain).is_some_and(|d| d.bypass),
            Some(None) => self.bypass,
            None => false,
        }
    }

    fn notify_bypass(&self, endpoint: u32, enabled: bool) {
        if let Some(listener) = self.listeners.get(&endpoint)
            && let Err(e) = listener.bypass(enabled)
        {
            tracing::warn!("endpoint {endpoint}: {} bypass failed: {e}", if enabled { "entering" } else { "leaving" });
        }
    }

    /// The `bypass` config field.
    pub fn bypass(&self) -> bool {
        self.bypass
    }

    /// Sets the `bypass` config field; unattached endpoints enter or leave bypass mode.
    pub fn set_bypass(&mut self, enabled: bool) {
        if self.bypass == enabled {
            return;
        }
        self.bypass = enabled;
        let unattached: Vec<u32> = self.endpoints.iter().filter(|(_, d)| d.is_none()).map(|(&ep, _)| ep).collect();
        for endpoint in unattached {
            self.notify_bypass(endpoint, enabled);
        }
    }

    /// DETACH. Returns the mappings the domain lost if it ceased to exist.
    pub fn detach(&mut self, domain: u32, endpoint: u32) -> (Status, Effect) {
        if !self.endpoints.contains_key(&endpoint) {
            return (Status::NoEnt, Effect::default());
        }
        if self.domain_of(endpoint) != Some(domain) {
            return (Status::Inval, Effect::default());
        }
        let lost = match self.domains.get(&domain) {
            Some(d) if d.endpoints.len() == 1 => Effect {
                unmapped: d.mappings.len() as u64,
                unmapped_bytes: d.mappings.values().map(Mapping::size).sum(),
                ..Effect::default()
            },
            _ => Effect::default(),
        };
        self.detach_endpoint(endpoint, domain);
        (Status::Ok, lost)
    }

    /// MAP `[start, end]` to `gpa`.
    pub fn map(
        &mut self,
        domain: u32,
        start: u64,
        end: u64,
        gpa: u64,
        flags: u32,
        mmio_feature: bool,
    ) -> (Status, Effect) {
        let known = MAP_F_READ | MAP_F_WRITE | if mmio_feature { MAP_F_MMIO } else { 0 };
        if flags & !known != 0 || end <= start {
            return (Status::Inval, Effect::default());
        }
        let Some(d) = self.domains.get(&domain) else { return (Status::NoEnt, Effect::default()) };
        if d.bypass {
            return (Status::Inval, Effect::default());
        }
        let g = self.limits.granule;
        let Some(size) = (end - start).checked_add(1) else { return (Status::Range, Effect::default()) };
        if start % g != 0 || gpa % g != 0 || size % g != 0 {
            return (Status::Range, Effect::default());
        }
        if start < self.limits.input_range.0 || end > self.limits.input_range.1 {
            return (Status::Range, Effect::default());
        }
        let Some(gpa_end) = gpa.checked_add(size) else { return (Status::Range, Effect::default()) };
        let in_ram = self.limits.guest_ram.iter().any(|&(s, e)| gpa >= s && gpa_end <= e);
        if !in_ram && flags & MAP_F_MMIO == 0 {
            return (Status::Range, Effect::default());
        }
        if self.limits.reserved.iter().any(|&(s, e)| start <= e && end >= s) {
            return (Status::Inval, Effect::default());
        }
        if let Some((_, prev)) = d.mappings.range(..=end).next_back()
            && prev.end >= start
        {
            return (Status::Inval, Effect::default());
        }
        if d.mappings.len() >= self.limits.max_mappings {
            return (Status::NoMem, Effect::default());
        }
        // Mirror to every listening endpoint first; undo the ones that succeeded if one fails.
        let write = flags & MAP_F_WRITE != 0;
        let listeners: Vec<Arc<dyn DmaMapListener>> =
            d.endpoints.iter().filter_map(|ep| self.listeners.get(ep).cloned()).collect();
        for (i, listener) in listeners.iter().enumerate() {
            if let Err(e) = listener.map(start, gpa, size, write) {
                tracing::warn!("domain {domain}: mirroring a map of {size:#x} at {start:#x} failed: {e}");
                for done in &listeners[..i] {
                    let _ = done.unmap(start, size);
                }
                return (Status::DevErr, Effect::default());
            }
        }
        let d = self.domains.get_mut(&domain).expect("checked above");
        d.mappings.insert(start, Mapping { start, end, gpa, flags });
        let mapped_writable = u64::from(write);
        (Status::Ok, Effect { mapped: 1, mapped_bytes: size, mapped_writable, mapped_gpa: gpa, ..Effect::default() })
    }

    /// UNMAP every mapping inside `[start, end]`; refuses to split a mapping.
    pub fn unmap(&mut self, domain: u32, start: u64, end: u64) -> (Status, Effect) {
        let Some(d) = self.domains.get(&domain) else { return (Status::NoEnt, Effect::default()) };
        if d.bypass {
            return (Status::Inval, Effect::default());
        }
        if end < start {
            return (Status::Inval, Effect::default());
        }
        let mut doomed = Vec::new();
        for (_, m) in d.mappings.range(..=end).rev() {
            if m.end < start {
                break;
            }
            if m.start < start || m.end > end {
                return (Status::Range, Effect::default());
            }
            doomed.push(*m);
        }
        let listeners: Vec<Arc<dyn DmaMapListener>> =
            d.endpoints.iter().filter_map(|ep| self.listeners.get(ep).cloned()).collect();
        let d = self.domains.get_mut(&domain).expect("checked above");
        let mut effect = Effect::default();
        for m in doomed {
            d.mappings.remove(&m.start);
            for listener in &listeners {
                if let Err(e) = listener.unmap(m.start, m.size()) {
                    tracing::warn!("domain {domain}: mirroring an unmap at {:#x} failed: {e}", m.start);
                }
            }
            effect.unmapped += 1;
            effect.unmapped_bytes += m.size();
        }
        (Status::Ok, effect)
    }

    /// Translates a DMA access of `len` bytes at `iova` by `endpoint` to a guest-physical address.
    pub fn translate(&self, endpoint: u32, iova: u64, len: u64, access: Access) -> Result<u64, Fault> {
        let last = iova.checked_add(len.max(1) - 1).ok_or(Fault::Unmapped)?;
        let domain = match self.endpoints.get(&endpoint) {
            None => return Err(Fault::NotAttached),
            Some(None) if self.bypass => return Ok(iova),
            Some(None) => return Err(Fault::NotAttached),
            Some(Some(domain)) => &self.domains[domain],
        };
        if domain.bypass {
            return Ok(iova);
        }
        let (_, m) = domain.mappings.range(..=iova).next_back().ok_or(Fault::Unmapped)?;
        if m.end < last {
            return Err(Fault::Unmapped);
        }
        let allowed = match access {
            Access::Read => m.flags & MAP_F_READ != 0,
            Access::Write => m.flags & MAP_F_WRITE != 0,
        };
        if !allowed {
            return Err(Fault::Permission);
        }
        Ok(m.gpa + (iova - m.start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use vm_device::dma::DmaMapError;

    pub(crate) fn limits() -> Limits {
        Limits {
            granule: 0x1000,
            input_range: (0, (1 << 48) - 1),
            domain_range: (1, 0xffff),
            max_mappings: 4,
            reserved: vec![(0xfee0_0000, 0xfeef_ffff)],
            guest_ram: vec![(0, 256 << 20)],
        }
    }

    fn spaces() -> AddressSpaces {
        AddressSpaces::new(limits(), [0, 0x10], false)
    }

    const RW: u32 = MAP_F_READ | MAP_F_WRITE;

    #[test]
    fn attach_rules() {
        let mut s = spaces();
        assert_eq!(s.attach(1, 7, 0, true), Status::NoEnt);
        assert_eq!(s.attach(0, 0, 0, true), Status::Range, "domain 0 is outside domain_range");
        assert_eq!(s.attach(1, 0, 2, true), Status::Inval, "unknown flag");
        assert_eq!(s.attach(1, 0, ATTACH_F_BYPASS, false), Status::Inval, "bypass flag without the feature");
        assert_eq!(s.attach(1, 0, 0, true), Status::Ok);
        assert_eq!(s.attach(1, 0x10, ATTACH_F_BYPASS, true), Status::Inval, "bypass does not match the domain");
        assert_eq!(s.attach(1, 0x10, 0, true), Status::Ok);
        assert_eq!(s.attach(2, 0, 0, true), Status::Ok, "moves to another domain");
        assert_eq!((s.domain_of(0), s.domain_of(0x10)), (Some(2), Some(1)));
        assert_eq!(s.detach(1, 0).0, Status::Inval, "not attached there");
        assert_eq!(s.detach(1, 9).0, Status::NoEnt);
        assert_eq!(s.detach(2, 0).0, Status::Ok);
    }

    #[test]
    fn map_rules_follow_the_spec() {
        let mut s = spaces();
        assert_eq!(s.map(1, 0, 0xfff, 0, RW, false).0, Status::NoEnt);
        s.attach(1, 0, 0, true);
        assert_eq!(s.map(1, 0x1000, 0x1fff, 0x8000, RW, false).0, Status::Ok);
        assert_eq!(s.map(1, 0x1000, 0x1fff, 0x9000, RW, false).0, Status::Inval, "overlap");
        assert_eq!(s.map(1, 0x800, 0x17ff, 0x9000, RW, false).0, Status::Range, "unaligned");
        assert_eq!(s.map(1, 0x3000, 0x3fff, 0x9000, 1 << 5, false).0, Status::Inval, "unknown flag");
        assert_eq!(s.map(1, 0x3000, 0x3fff, 0x9000, MAP_F_MMIO, false).0, Status::Inval, "MMIO without the feature");
        assert_eq!(s.map(1, 0x3000, 0x2fff, 0x9000, RW, false).0, Status::Inval, "end before start");
        assert_eq!(s.map(1, 0xfee0_0000, 0xfee0_0fff, 0x9000, RW, false).0, Status::Inval, "MSI window");
        assert_eq!(s.map(1, 0x3000, 0x3fff, 512 << 20, RW, false).0, Status::Range, "outside guest RAM");
        assert_eq!(s.map(1, 1 << 48, (1 << 48) + 0xfff, 0x9000, RW, false).0, Status::Range, "beyond input range");
        for i in 0..3u64 {
            assert_eq!(s.map(1, 0x10_0000 * (i + 1), 0x10_0000 * (i + 1) + 0xfff, 0, RW, false).0, Status::Ok);
        }
        assert_eq!(s.map(1, 0x50_0000, 0x50_0fff, 0, RW, false).0, Status::NoMem, "per-domain limit");
        s.attach(2, 0x10, ATTACH_F_BYPASS, true);
        assert_eq!(s.map(2, 0x1000, 0x1fff, 0, RW, false).0, Status::Inval, "bypass domain");
    }

    #[test]
    fn unmap_examples_of_the_spec() {
        // The seven examples of virtio 1.2, 5.13.6.6, with addresses in pages.
        let page = |n: u64| n * 0x1000;
        let fresh = || {
            let mut s = spaces();
            s.attach(1, 0, 0, true);
            s
        };
        let map = |s: &mut AddressSpaces, a: u64, b: u64| {
            assert_eq!(s.map(1, page(a), page(b + 1) - 1, 0, RW, false).0, Status::Ok)
        };
        let unmap = |s: &mut AddressSpaces, a: u64, b: u64| s.unmap(1, page(a), page(b + 1) - 1);

        let mut s = fresh();
        assert_eq!(unmap(&mut s, 0, 4), (Status::Ok, Effect::default()));
        let mut s = fresh();
        map(&mut s, 0, 9);
        assert_eq!(unmap(&mut s, 0, 9).1.unmapped, 1);
        let mut s = fresh();
        map(&mut s, 0, 4);
        map(&mut s, 5, 9);
        assert_eq!(unmap(&mut s, 0, 9).1.unmapped, 2);
        let mut s = fresh();
        map(&mut s, 0, 9);
        assert_eq!(unmap(&mut s, 0, 4).0, Status::Range);
        assert_eq!(s.live_mappings(), 1, "nothing removed");
        let mut s = fresh();
        map(&mut s, 0, 4);
        map(&mut s, 5, 9);
        assert_eq!(unmap(&mut s, 0, 4).1.unmapped, 1);
        assert_eq!(s.live_mappings(), 1);
        let mut s = fresh();
        map(&mut s, 0, 4);
        assert_eq!(unmap(&mut s, 0, 9).1.unmapped, 1);
        let mut s = fresh();
        map(&mut s, 0, 4);
        map(&mut s, 10, 14);
        let (status, effect) = unmap(&mut s, 0, 14);
        assert_eq!((status, effect.unmapped, effect.unmapped_bytes), (Status::Ok, 2, page(10)));
    }

    #[test]
    fn translation_and_faults() {
        let mut s = spaces();
        assert_eq!(s.translate(0, 0x1000, 4, Access::Read), Err(Fault::NotAttached));
        s.set_bypass(true);
        assert_eq!(s.translate(0, 0x1234, 4, Access::Write), Ok(0x1234), "bypass: identity");
        s.attach(1, 0, 0, true);
        s.map(1, 0x1000, 0x2fff, 0x8000, MAP_F_READ, false);
        assert_eq!(s.translate(0, 0x1800, 0x100, Access::Read), Ok(0x8800));
        assert_eq!(s.translate(0, 0x1800, 4, Access::Write), Err(Fault::Permission));
        assert_eq!(s.translate(0, 0x2f00, 0x200, Access::Read), Err(Fault::Unmapped), "runs off the end");
        assert_eq!(s.translate(0, 0x4000, 4, Access::Read), Err(Fault::Unmapped));
        assert_eq!(s.translate(0x10, 0x1800, 4, Access::Read), Ok(0x1800), "another endpoint, unattached, bypass");
    }

    #[derive(Default)]
    struct Recorder {
        log: Mutex<Vec<String>>,
        fail_maps: bool,
    }

    impl DmaMapListener for Recorder {
        fn map(&self, iova: u64, gpa: u64, size: u64, write: bool) -> Result<(), DmaMapError> {
            if self.fail_maps {
                return Err(DmaMapError::new("map", "refused"));
            }
            self.log.lock().unwrap().push(format!("map {iova:#x} {gpa:#x} {size:#x} {write}"));
            Ok(())
        }
        fn unmap(&self, iova: u64, size: u64) -> Result<(), DmaMapError> {
            self.log.lock().unwrap().push(format!("unmap {iova:#x} {size:#x}"));
            Ok(())
        }
        fn bypass(&self, enabled: bool) -> Result<(), DmaMapError> {
            self.log.lock().unwrap().push(format!("bypass {enabled}"));
            Ok(())
        }
    }

    #[test]
    fn restored_spaces_translate_as_before_and_tell_listeners_what_changed() {
        let mut first = AddressSpaces::new(limits(), [0, 0x10], true);
        first.set_bypass(false);
        first.attach(1, 0x10, 0, true);
        first.map(1, 0x1000, 0x1fff, 0x8000, RW, false);
        first.attach(2, 0, 0, true);
        let saved: AddressSpacesState = serde_json::from_str(&serde_json::to_string(&first.state()).unwrap()).unwrap();

        // The new VM's spaces start from the spec's bypass; endpoint 0's device listens.
        let mut restored = AddressSpaces::new(limits(), [0, 0x10], true);
        let rec = Arc::new(Recorder::default());
        restored.set_listener(0x10, rec.clone());
        restored.restore(&saved).unwrap();
        assert_eq!(restored.translate(0x10, 0x1010, 4, Access::Write), Ok(0x8010));
        assert_eq!(restored.translate(0, 0x1010, 4, Access::Read), Err(Fault::Unmapped));
        assert_eq!((restored.domain_of(0), restored.bypass()), (Some(2), false));
        assert_eq!(*rec.log.lock().unwrap(), ["bypass false", "map 0x1000 0x8000 0x1000 true"]);
        assert_eq!(restored.state(), saved);
        // Detaching the last endpoint ends the domain as it would have before.
        assert_eq!(restored.detach(1, 0x10).0, Status::Ok);
        assert_eq!(restored.live_mappings(), 0);

        let mut other = AddressSpaces::new(limits(), [0, 0x18], true);
        assert!(other.restore(&saved).unwrap_err().contains("endpoints"));
        let mut broken = saved.clone();
        broken.domains.clear();
        assert!(AddressSpaces::new(limits(), [0, 0x10], true).restore(&broken).is_err());
    }

    #[test]
    fn listeners_hear_bypass_transitions_before_mappings() {
        let mut s = AddressSpaces::new(limits(), [0, 0x10], true);
        let rec = Arc::new(Recorder::default());
        s.set_listener(0, rec.clone());
        s.attach(1, 0x10, 0, true);
        s.map(1, 0x1000, 0x1fff, 0x8000, RW, false);
        s.attach(1, 0, 0, true); // joins a domain with a mapping: leave bypass, then replay
        s.detach(1, 0); // back to bypass
        s.set_bypass(false); // unattached and no longer bypassing
        s.attach(2, 0, ATTACH_F_BYPASS, true); // a bypass domain
        let log = rec.log.lock().unwrap().clone();
        assert_eq!(
            log,
            vec![
                "bypass false",
                "map 0x1000 0x8000 0x1000 true",
                "unmap 0x1000 0x1000",
                "bypass true",
                "bypass false",
                "bypass true"
            ]
        );
        assert!(s.in_bypass(0) && !s.in_bypass(0x10));
    }

    #[test]
    fn listeners_mirror_maps_and_roll_back() {
        let mut s = spaces();
        let good = Arc::new(Recorder::default());
        s.set_listener(0, good.clone());
        s.attach(1, 0, 0, true);
        assert_eq!(s.map(1, 0x1000, 0x1fff, 0x8000, RW, false).0, Status::Ok);
        // A second endpoint whose listener fails: the map is refused and undone for the first.
        let bad = Arc::new(Recorder { fail_maps: true, ..Recorder::default() });
        s.set_listener(0x10, bad);
        s.attach(1, 0x10, 0, true);
        assert_eq!(s.map(1, 0x4000, 0x4fff, 0x9000, MAP_F_READ, false).0, Status::DevErr);
        assert_eq!(s.live_mappings(), 1);
        assert_eq!(s.detach(1, 0x10).0, Status::Ok);
        assert_eq!(s.unmap(1, 0, u64::MAX).1.unmapped, 1);
        let log = good.log.lock().unwrap().clone();
        assert_eq!(
            log,
            vec![
                "map 0x1000 0x8000 0x1000 true",
                "map 0x4000 0x9000 0x1000 false",
                "unmap 0x4000 0x1000",
                "unmap 0x1000 0x1000"
            ]
        );
    }

    #[test]
    fn last_detach_drops_the_domain_and_its_mappings() {
        let mut s = spaces();
        s.attach(1, 0, 0, true);
        s.map(1, 0x1000, 0x1fff, 0, RW, false);
        let (status, lost) = s.detach(1, 0);
        assert_eq!((status, lost.unmapped), (Status::Ok, 1));
        assert_eq!(s.live_mappings(), 0);
        assert_eq!(s.map(1, 0x1000, 0x1fff, 0, RW, false).0, Status::NoEnt);
    }
}
