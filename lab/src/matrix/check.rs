//! Checking a matrix as written: each section on its own, then that its parts go together. The
//! first mistake is the error, with its file, line and field.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;

use super::{
    BootMode, DeviceSource, EngineKind, Image, KernelRef, MAX_DESCRIPTION, MAX_MESSAGE, MAX_NAME, MAX_REPETITIONS,
    MAX_SELFTEST_TIMEOUT, MIN_MESSAGE, Matrix, MatrixError, MatrixErrorKind, ParamValues, Workload,
};

/// The line of `text` where `span` starts.
pub(super) fn line_of(text: &str, span: Range<usize>) -> usize {
    text[..span.start.min(text.len())].matches('\n').count() + 1
}

/// Checks a matrix as written, naming the file, line and field of its first mistake.
pub(super) struct Checker<'a> {
    /// The matrix file.
    pub(super) file: &'a Path,
    /// The text the matrix's spans point into, when errors can give lines.
    pub(super) text: Option<&'a str>,
}

impl Checker<'_> {
    pub(super) fn error(
        &self,
        span: Option<Range<usize>>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> MatrixError {
        MatrixError {
            kind: MatrixErrorKind::Invalid,
            file: self.file.to_path_buf(),
            line: span.zip(self.text).map(|(s, text)| line_of(text, s)),
            field: field.into(),
            message: message.into(),
        }
    }

    fn unique<'n>(
        &self,
        what: &str,
        names: impl Iterator<Item = (&'n str, Range<usize>)>,
    ) -> Result<BTreeSet<&'n str>, MatrixError> {
        let mut seen = BTreeSet::new();
        for (i, (name, span)) in names.enumerate() {
            if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c.is_control() || c == '/' || c == '[') {
                return Err(self.error(Some(span), format!("{what}[{i}].name"), "a name is one word without / or ["));
            }
            if name.len() > MAX_NAME {
                let why = format!("{} bytes; a name has at most {MAX_NAME}", name.len());
                return Err(self.error(Some(span), format!("{what}[{i}].name"), why));
            }
            if !seen.insert(name) {
                return Err(self.error(Some(span), format!("{what}[{i}].name"), format!("{name:?} is used twice")));
            }
        }
        Ok(seen)
    }

    /// Checks `m`; its devices' typed forms, by name.
    pub(super) fn check(&self, m: &Matrix) -> Result<BTreeMap<String, DeviceSource>, MatrixError> {
        self.check_top(m)?;
        self.unique("device", m.devices.iter().map(|d| (d.get_ref().name.as_str(), d.span())))?;
        let images = self.unique("image", m.images.iter().map(|i| (i.get_ref().name.as_str(), i.span())))?;
        let variants = self.unique("variant", m.variants.iter().map(|v| (v.get_ref().name.as_str(), v.span())))?;
        self.unique("workload", m.workloads.iter().map(|w| (w.get_ref().name(), w.span())))?;
        let sources = self.check_devices(m)?;
        self.check_images(m)?;
        self.check_variants(m, &images, &variants)?;
        self.check_workloads(m)?;
        self.check_compatibility(m)?;
        Ok(sources)
    }

    /// The matrix's own fields, and that every section has an entry.
    fn check_top(&self, m: &Matrix) -> Result<(), MatrixError> {
        if m.name.trim().is_empty() {
            return Err(self.error(None, "name", "give the matrix a name"));
        }
        if m.name.len() > MAX_NAME || m.name.contains(char::is_control) {
            let why = format!("one line of at most {MAX_NAME} bytes ({} given)", m.name.len());
            return Err(self.error(None, "name", why));
        }
        if m.description.len() > MAX_DESCRIPTION {
            let why = format!("{} bytes; at most {MAX_DESCRIPTION}", m.description.len());
            return Err(self.error(None, "description", why));
        }
        if m.repetitions == 0 || m.repetitions > MAX_REPETITIONS {
            return Err(self.error(None, "repetitions", format!("must be between 1 and {MAX_REPETITIONS}")));
        }
        for (field, value) in [("timeout_s", m.timeout_s), ("silence_s", m.silence_s)] {
            if !(value.is_finite() && value > 0.0 && value <= vm_spec::spec::MAX_TIMEOUT_S) {
                return Err(self.error(None, field, "must be a positive number of seconds"));
            }
        }
        for (what, empty) in [
            ("device", m.devices.is_empty()),
            ("image", m.images.is_empty()),
            ("variant", m.variants.is_empty()),
            ("workload", m.workloads.is_empty()),
        ] {
            if empty {
                return Err(self.error(None, what, format!("at least one [[{what}]] is needed")));
            }
        }
        Ok(())
    }

    /// Each device, into its typed form.
    fn check_devices(&self, m: &Matrix) -> Result<BTreeMap<String, DeviceSource>, MatrixError> {
        let mut sources = BTreeMap::new();
        for (i, d) in m.devices.iter().enumerate() {
            match d.get_ref().source() {
                Ok(source) => sources.insert(d.get_ref().name.clone(), source),
                Err((field, message)) => {
                    return Err(self.error(Some(d.span()), format!("device[{i}]{field}"), message));
                }
            };
        }
        Ok(sources)
    }

    /// Each image: the VM limits, and that its parts go together.
    fn check_images(&self, m: &Matrix) -> Result<(), MatrixError> {
        for (i, image) in m.images.iter().enumerate() {
            let (span, image) = (image.span(), image.get_ref());
            // The VM limits every VM has (vm-spec's), on what the image fixes.
            let probe = vm_spec::VmSpec {
                memory_mib: image.memory_mib,
                vcpus: image.vcpus,
                cmdline: image.cmdline.clone(),
                ..vm_spec::VmSpec::new(vm_spec::Kernel::Probe)
            };
            if let Err(e) = probe.validate_within(&vm_spec::VmLimits::LAB) {
                return Err(self.error(Some(span), format!("image[{i}]"), e.to_string()));
            }
            if image.is_probe() && image.initrd.is_some() {
                return Err(self.error(Some(span), format!("image[{i}].initrd"), "the probe takes no initrd"));
            }
            if let Err(why) = recipe_names(image) {
                return Err(self.error(Some(span), format!("image[{i}].{}", why.0), why.1));
            }
            let agent = image.is_agent_initrd();
            if !image.patches.is_empty() && !agent {
                return Err(self.error(
                    Some(span),
                    format!("image[{i}].patches"),
                    "patches build the driver into the initramfs the lab makes: give initrd = \"agent\"",
                ));
            }
            if agent && !matches!(image.kernel, KernelRef::Debian { .. } | KernelRef::Store(_)) {
                return Err(self.error(
                    Some(span),
                    format!("image[{i}].initrd"),
                    "initrd = \"agent\" is built for a kernel image: give kernel = \"debian\" or a kernel image's ID",
                ));
            }
            if image.engine == EngineKind::Driverlab && image.accel != engines::qemu::Accel::Tcg {
                return Err(self.error(Some(span), format!("image[{i}].accel"), "accel is for engine = \"qemu\""));
            }
        }
        Ok(())
    }

    /// Each variant's image and parameters, and the baseline.
    fn check_variants(
        &self,
        m: &Matrix,
        images: &BTreeSet<&str>,
        variants: &BTreeSet<&str>,
    ) -> Result<(), MatrixError> {
        for (i, v) in m.variants.iter().enumerate() {
            let v = v.get_ref();
            if !images.contains(v.image.get_ref().as_str()) {
                return Err(self.error(
                    Some(v.image.span()),
                    format!("variant[{i}].image"),
                    format!("no image is called {:?}", v.image.get_ref()),
                ));
            }
            for (key, values) in &v.params {
                let field = format!("variant[{i}].params.{key}");
                if key.is_empty() || key.contains(|c: char| c.is_whitespace() || c == '=') {
                    return Err(self.error(None, field, "a parameter is module.name, without spaces or ="));
                }
                let list = match values {
                    ParamValues::One(v) => std::slice::from_ref(v),
                    ParamValues::Many(list) if list.is_empty() => {
                        return Err(self.error(None, field, "an empty list of values"));
                    }
                    ParamValues::Many(list) => list.as_slice(),
                };
                if list.iter().any(|value| value.to_string().contains(char::is_whitespace)) {
                    return Err(self.error(None, field, "a value is one word"));
                }
            }
        }
        if let Some(baseline) = &m.baseline
            && !variants.contains(baseline.get_ref().as_str())
        {
            return Err(self.error(
                Some(baseline.span()),
                "baseline",
                format!("no variant is called {:?}", baseline.get_ref()),
            ));
        }
        Ok(())
    }

    /// Each workload's ranges.
    fn check_workloads(&self, m: &Matrix) -> Result<(), MatrixError> {
        for (i, w) in m.workloads.iter().enumerate() {
            let (span, w) = (w.span(), w.get_ref());
            let refuse =
                |field: &str, why: String| Err(self.error(Some(span.clone()), format!("workload[{i}].{field}"), why));
            match w {
                Workload::ProbeRx { frames, .. } if *frames == 0 => {
                    return refuse("frames", "at least one frame".into());
                }
                Workload::Iperf3 { ip, duration_s, streams, mtu, .. } => {
                    if let Err((field, why)) = check_traffic(*ip, *duration_s, *streams, *mtu) {
                        return refuse(field, why);
                    }
                    if let Workload::Iperf3 {
                        surprise_unplug_after_s: Some(_), orderly_unplug_after_s: Some(_), ..
                    } = w
                    {
                        let why = "one unplug check per workload: surprise_unplug_after_s or orderly_unplug_after_s";
                        return refuse("orderly_unplug_after_s", why.into());
                    }
                    if let Some((after, _)) = w.unplug()
                        && !(after.is_finite() && after > 0.0 && after < *duration_s)
                    {
                        return refuse(w.unplug_field(), "more than 0 seconds and less than duration_s".into());
                    }
                }
                Workload::PacketRate { ip, duration_s, streams, mtu, frame_bytes, .. } => {
                    if let Err((field, why)) = check_traffic(*ip, *duration_s, *streams, *mtu) {
                        return refuse(field, why);
                    }
                    if let Err(why) = check_frame(*frame_bytes, *ip, *mtu) {
                        return refuse("frame_bytes", why);
                    }
                }
                Workload::Xdp { duration_s, mtu, frame_bytes, .. } => {
                    if let Err((field, why)) = check_traffic(4, *duration_s, 1, *mtu) {
                        return refuse(field, why);
                    }
                    if let Err(why) = check_frame(*frame_bytes, 4, *mtu) {
                        return refuse("frame_bytes", why);
                    }
                }
                Workload::Latency { duration_s, mtu, message_bytes, .. } => {
                    if let Err((field, why)) = check_traffic(4, *duration_s, 1, *mtu) {
                        return refuse(field, why);
                    }
                    if !(MIN_MESSAGE..=MAX_MESSAGE).contains(message_bytes) {
                        let why = format!("{message_bytes} bytes: sockperf sends {MIN_MESSAGE} to {MAX_MESSAGE}");
                        return refuse("message_bytes", why);
                    }
                }
                Workload::Kselftest { tests, timeout_s, mtu, .. } => {
                    if let Err((field, why)) = check_traffic(4, 1.0, 1, *mtu) {
                        return refuse(field, why);
                    }
                    if tests.is_empty() {
                        return refuse("tests", "at least one test".into());
                    }
                    if let Some(twice) = tests.iter().enumerate().find(|(i, t)| tests[..*i].contains(t)) {
                        return refuse("tests", format!("{:?} is listed twice", twice.1.as_str()));
                    }
                    if !(10..=MAX_SELFTEST_TIMEOUT).contains(timeout_s) {
                        return refuse("timeout_s", format!("10 to {MAX_SELFTEST_TIMEOUT} seconds"));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// That the parts go together: every variant runs under some workload (a probe image takes
    /// probe workloads, a Linux image the others), and the probe drives every device a probe
    /// cell runs on.
    fn check_compatibility(&self, m: &Matrix) -> Result<(), MatrixError> {
        for (i, v) in m.variants.iter().enumerate() {
            let v = v.get_ref();
            let image = m.images.iter().map(|i| i.get_ref()).find(|i| i.name == *v.image.get_ref());
            let probe = image.is_some_and(Image::is_probe);
            if !m.workloads.iter().any(|w| matches!(w.get_ref(), Workload::ProbeRx { .. }) == probe) {
                let wanted = if probe { "a probe-rx workload" } else { "an iperf3 workload" };
                return Err(self.error(
                    Some(v.image.span()),
                    format!("variant[{i}]"),
                    format!("its image {:?} needs {wanted}, and the matrix has none", v.image.get_ref()),
                ));
            }
        }
        // The probe drives only the NICs driverlab knows, and a probe-rx cell runs on every device.
        let probe_cells = m.variants.iter().any(|v| {
            m.images.iter().any(|i| i.get_ref().name == *v.get_ref().image.get_ref() && i.get_ref().is_probe())
        });
        if probe_cells && let Some((i, d)) = m.devices.iter().enumerate().find(|(_, d)| d.get_ref().nic().is_none()) {
            return Err(self.error(
                Some(d.span()),
                format!("device[{i}].driver"),
                format!(
                    "the probe guest drives {} ({}), not a {:?} device: run Linux images on it",
                    vm_spec::NicKind::names(),
                    vm_spec::NicKind::ALL.map(vm_spec::NicKind::linux_driver).join(", "),
                    d.get_ref().linux_driver()
                ),
            ));
        }
        self.check_xdp_drivers(m)?;
        self.check_slots(m, probe_cells)?;
        self.check_boot(m)
    }

    /// `boot = "snapshot"` restores the cells of Linux images on driverlab's engine whose device
    /// waits in a Thunderbolt slot (the slot is where the restored guest gets its NIC); a matrix
    /// with no such cell would boot every repetition while saying it restores them.
    fn check_boot(&self, m: &Matrix) -> Result<(), MatrixError> {
        if m.boot != BootMode::Snapshot {
            return Ok(());
        }
        if !m.devices.iter().any(|d| d.get_ref().slot == Some(vm_spec::Slot::Thunderbolt)) {
            let why = "no device sits in a thunderbolt slot: a restored guest gets its NIC plugged into \
                       one (put a device in slot = \"thunderbolt\", or drop boot = \"snapshot\")";
            return Err(self.error(None, "boot", why));
        }
        let restorable = |i: &Image| !i.is_probe() && i.engine == EngineKind::Driverlab;
        if !m.images.iter().any(|i| restorable(i.get_ref())) {
            let why = "no image is a Linux image on engine = \"driverlab\": only those cells start from a \
                       snapshot (drop boot = \"snapshot\")";
            return Err(self.error(None, "boot", why));
        }
        Ok(())
    }

    /// An xdp cell on a device whose driver has no XDP at all could only fail: refused before
    /// the run, naming the driver (a driver with XDP that cannot attach natively fails its
    /// cell's `xdp` step with the driver's words).
    fn check_xdp_drivers(&self, m: &Matrix) -> Result<(), MatrixError> {
        let xdp = m.workloads.iter().enumerate().find(|(_, w)| matches!(w.get_ref(), Workload::Xdp { .. }));
        let Some((j, w)) = xdp else { return Ok(()) };
        for (i, d) in m.devices.iter().enumerate() {
            let driver = d.get_ref().linux_driver();
            if let Some((_, source)) = DRIVERS_WITHOUT_XDP.iter().find(|(name, _)| *name == driver) {
                let why = format!(
                    "device[{i}]'s driver {driver} has no XDP in Linux 6.12 (no ndo_bpf in {source}): an xdp workload \
                     needs a driver with native XDP, such as atlantic"
                );
                return Err(self.error(Some(w.span()), format!("workload[{j}].kind"), why));
            }
        }
        Ok(())
    }

    /// A Thunderbolt slot is a root port with its own bus, which the probe guest does not scan
    /// (it drives bus 0); the QEMU engine's is external-facing but not natively hot-plugged, so
    /// nothing is pulled from it: such a cell would not be what it says.
    fn check_slots(&self, m: &Matrix, probe_cells: bool) -> Result<(), MatrixError> {
        for (i, v) in m.variants.iter().enumerate() {
            let probe =
                m.images.iter().any(|im| im.get_ref().name == *v.get_ref().image.get_ref() && im.get_ref().is_probe());
            if probe && v.get_ref().iommu_domain.is_some() {
                let why = "the probe guest has no IOMMU domain to choose: iommu_domain is for Linux images";
                return Err(self.error(Some(v.span()), format!("variant[{i}].iommu_domain"), why));
            }
        }
        let pulls = m.workloads.iter().enumerate().find(|(_, w)| w.get_ref().unplug().is_some());
        let fixed = m.devices.iter().enumerate().find(|(_, d)| d.get_ref().slot != Some(vm_spec::Slot::Thunderbolt));
        if let (Some((j, w)), Some((i, _))) = (pulls, fixed) {
            let why =
                format!("device[{i}] is not in a thunderbolt slot: only a hot-plug slot's device can be unplugged");
            return Err(self.error(Some(w.span()), format!("workload[{j}].{}", w.get_ref().unplug_field()), why));
        }
        let thunderbolt =
            m.devices.iter().enumerate().find(|(_, d)| d.get_ref().slot == Some(vm_spec::Slot::Thunderbolt));
        let Some((i, d)) = thunderbolt else { return Ok(()) };
        if probe_cells {
            let why = "the probe guest finds its NIC on bus 0 only: a thunderbolt slot needs Linux images";
            return Err(self.error(Some(d.span()), format!("device[{i}].slot"), why));
        }
        let qemu = m.images.iter().enumerate().find(|(_, i)| i.get_ref().engine == EngineKind::Qemu);
        if let (Some((j, w)), Some((k, _))) = (pulls, qemu) {
            let why = format!(
                "image[{k}] runs on the QEMU engine, whose slots are occupied at boot and emptied by nothing \
                 (its root ports hot-plug through ACPI, not pciehp): the unplug checks need engine = \"driverlab\""
            );
            return Err(self.error(Some(w.span()), format!("workload[{j}].{}", w.get_ref().unplug_field()), why));
        }
        Ok(())
    }
}

/// Drivers with no XDP at all in Linux 6.12 (no `ndo_bpf` among their net_device_ops), and the
/// file that says so.
const DRIVERS_WITHOUT_XDP: &[(&str, &str)] = &[("lan743x", "drivers/net/ethernet/microchip/lan743x_main.c")];

/// An image's recipe fields name things, never paths out of the kernel tree: `driver` is a
/// folder of the tree (`drivers/...`, name parts only), `module` a module name. The field that
/// is not, and why.
fn recipe_names(image: &super::Image) -> Result<(), (&'static str, String)> {
    let part = |p: &str| {
        !p.is_empty() && p != "." && p != ".." && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.+".contains(&b))
    };
    let folder = image.driver.trim_end_matches('/');
    if !folder.starts_with("drivers/") || !folder.split('/').all(part) {
        let why = format!(
            "{:?}: give a driver's folder of the kernel tree, e.g. drivers/net/ethernet/aquantia/atlantic",
            image.driver
        );
        return Err(("driver", why));
    }
    let module = image.module_name();
    if module.is_empty()
        || module.len() > 55
        || !module.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err((
            "module",
            format!("{module:?}: give a kernel module's name (letters, digits, _ and -), e.g. atlantic"),
        ));
    }
    Ok(())
}

/// The ranges every traffic workload shares: the field at fault and why.
fn check_traffic(ip: u8, duration_s: f64, streams: u32, mtu: u32) -> Result<(), (&'static str, String)> {
    if ip != 4 && ip != 6 {
        return Err(("ip", "4 or 6".into()));
    }
    if !(duration_s.is_finite() && duration_s > 0.0 && duration_s <= 3600.0) {
        return Err(("duration_s", "0 to 3600 seconds".into()));
    }
    if streams == 0 || streams > 128 {
        return Err(("streams", "1 to 128".into()));
    }
    if !(68..=16_000).contains(&mtu) {
        return Err(("mtu", "68 to 16000".into()));
    }
    Ok(())
}

/// That a `frame_bytes` frame is an Ethernet frame the MTU lets through, with room for iperf3's
/// UDP payload over IP version `ip`.
fn check_frame(frame_bytes: u32, ip: u8, mtu: u32) -> Result<(), String> {
    use super::{ETHERNET_OVERHEAD, MIN_FRAME, MIN_IPERF_PAYLOAD, udp_payload};
    let largest = mtu + ETHERNET_OVERHEAD;
    if frame_bytes < MIN_FRAME {
        return Err(format!("{frame_bytes} bytes is below Ethernet's shortest frame, {MIN_FRAME} bytes with its FCS"));
    }
    if frame_bytes > largest {
        return Err(format!(
            "{frame_bytes} bytes is above the largest frame MTU {mtu} lets through ({largest} bytes with header and \
             FCS): raise mtu for jumbo frames"
        ));
    }
    if udp_payload(frame_bytes, ip).is_none_or(|p| p < MIN_IPERF_PAYLOAD) {
        let least =
            (MIN_FRAME..).find(|&f| udp_payload(f, ip).is_some_and(|p| p >= MIN_IPERF_PAYLOAD)).unwrap_or(MIN_FRAME);
        return Err(format!(
            "{frame_bytes} bytes leaves no room over IPv{ip} for iperf3's {MIN_IPERF_PAYLOAD}-byte UDP header: at \
             least {least}"
        ));
    }
    Ok(())
}
