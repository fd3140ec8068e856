//! A device to pass through and where the guest sees it: [`DeviceSpec`].
//!
//! In JSON `{"vfio": "0000:63:00.0"}` or `{"vfio-user": "/path/to/socket"}`, with an optional
//! `"slot": "thunderbolt"`; on the command line `vfio=0000:63:00.0[,slot=thunderbolt]`. The wire
//! form is [`RawDevice`], checked once into a [`DeviceSpec`].

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::bdf::Bdf;

/// Where a device is served from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceBackend {
    /// A host PCI device bound to vfio-pci.
    Vfio(Bdf),
    /// A device served over vfio-user on a Unix socket.
    VfioUser(PathBuf),
}

impl fmt::Display for DeviceBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceBackend::Vfio(bdf) => write!(f, "vfio={bdf}"),
            DeviceBackend::VfioUser(path) => write!(f, "vfio-user={}", path.display()),
        }
    }
}

/// Where the guest finds a device in its PCI topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Slot {
    /// On the root bus, as an integrated device: trusted, the guest's default IOMMU domain.
    #[default]
    Root,
    /// Behind a PCIe root port that firmware declares external-facing, with a hot-plug slot: the
    /// guest marks the device untrusted (strict IOMMU domain, unaligned mappings bounced), as a
    /// Thunderbolt/USB4-attached device is on the user's machine.
    Thunderbolt,
}

impl Slot {
    /// The name in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Slot::Root => "root",
            Slot::Thunderbolt => "thunderbolt",
        }
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Slot {
    type Err = DeviceSpecError;

    fn from_str(s: &str) -> Result<Self, DeviceSpecError> {
        match s {
            "root" => Ok(Slot::Root),
            "thunderbolt" => Ok(Slot::Thunderbolt),
            _ => Err(DeviceSpecError(format!("slot {s:?}: write slot=root or slot=thunderbolt"))),
        }
    }
}

/// A device to pass through, and its slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawDevice", into = "RawDevice")]
pub struct DeviceSpec {
    /// Where it is served from.
    pub backend: DeviceBackend,
    /// Where the guest sees it.
    pub slot: Slot,
    /// Whether it is in its slot when the guest starts; a device that is not waits for the
    /// control socket's `vm.plug` (a hot-plug slot only).
    pub plugged: bool,
}

impl DeviceSpec {
    /// A host device bound to vfio-pci, on the root bus.
    pub fn vfio(bdf: Bdf) -> Self {
        DeviceSpec { backend: DeviceBackend::Vfio(bdf), slot: Slot::Root, plugged: true }
    }

    /// A vfio-user device at `socket`, on the root bus.
    pub fn vfio_user(socket: impl Into<PathBuf>) -> Self {
        DeviceSpec { backend: DeviceBackend::VfioUser(socket.into()), slot: Slot::Root, plugged: true }
    }

    /// The same device in `slot`.
    pub fn in_slot(self, slot: Slot) -> Self {
        DeviceSpec { slot, ..self }
    }

    /// The same device, its slot empty when the guest starts (see [`DeviceSpec::plugged`]).
    pub fn plugged_later(self) -> Self {
        DeviceSpec { plugged: false, ..self }
    }
}

/// A device as JSON carries it: exactly one of `vfio` and `vfio-user`, and an optional slot.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RawDevice {
    /// A host PCI address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio: Option<Bdf>,
    /// A vfio-user socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio_user: Option<PathBuf>,
    /// The slot; the root bus when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<Slot>,
    /// `false`: the slot starts empty; true when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugged: Option<bool>,
}

impl TryFrom<RawDevice> for DeviceSpec {
    type Error = DeviceSpecError;

    fn try_from(raw: RawDevice) -> Result<Self, DeviceSpecError> {
        let backend = match (raw.vfio, raw.vfio_user) {
            (Some(bdf), None) => DeviceBackend::Vfio(bdf),
            (None, Some(path)) if !path.as_os_str().is_empty() => DeviceBackend::VfioUser(path),
            (None, Some(_)) => return Err(DeviceSpecError("vfio-user: the socket path is empty".into())),
            _ => return Err(DeviceSpecError("give exactly one of \"vfio\" and \"vfio-user\"".into())),
        };
        let (slot, plugged) = (raw.slot.unwrap_or_default(), raw.plugged.unwrap_or(true));
        DeviceSpec::placed(backend, slot, plugged)
    }
}

impl From<DeviceSpec> for RawDevice {
    fn from(spec: DeviceSpec) -> Self {
        let slot = (spec.slot != Slot::Root).then_some(spec.slot);
        let plugged = (!spec.plugged).then_some(false);
        match spec.backend {
            DeviceBackend::Vfio(bdf) => RawDevice { vfio: Some(bdf), vfio_user: None, slot, plugged },
            DeviceBackend::VfioUser(path) => RawDevice { vfio: None, vfio_user: Some(path), slot, plugged },
        }
    }
}

/// A device argument that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DeviceSpecError(String);

impl FromStr for DeviceSpec {
    type Err = DeviceSpecError;

    fn from_str(s: &str) -> Result<Self, DeviceSpecError> {
        let mut parts = s.split(',');
        let backend = match parts.next().unwrap_or_default().split_once('=') {
            Some(("vfio", bdf)) => bdf.parse().map(DeviceBackend::Vfio).map_err(|e| DeviceSpecError(e.to_string()))?,
            Some(("vfio-user", path)) if !path.is_empty() => DeviceBackend::VfioUser(PathBuf::from(path)),
            _ => {
                let usage = "write vfio=0000:63:00.0 or vfio-user=/path/to/socket, then ,slot=thunderbolt if wanted";
                return Err(DeviceSpecError(format!("{s:?}: {usage}")));
            }
        };
        let (mut slot, mut plugged) = (Slot::Root, true);
        for option in parts {
            match option.split_once('=') {
                Some(("slot", name)) => slot = name.parse()?,
                Some(("plugged", "true")) => plugged = true,
                Some(("plugged", "false")) => plugged = false,
                _ => {
                    let known = "slot=root|thunderbolt and plugged=true|false are the options";
                    return Err(DeviceSpecError(format!("{s:?}: unknown option {option:?}; {known}")));
                }
            }
        }
        DeviceSpec::placed(backend, slot, plugged)
    }
}

impl DeviceSpec {
    /// A device in `slot`, in it from the start or not; only a hot-plug slot can start empty.
    fn placed(backend: DeviceBackend, slot: Slot, plugged: bool) -> Result<Self, DeviceSpecError> {
        if !plugged && slot == Slot::Root {
            let why = "plugged=false: the root bus has no hot-plug slot; give slot=thunderbolt too";
            return Err(DeviceSpecError(why.into()));
        }
        Ok(DeviceSpec { backend, slot, plugged })
    }
}

impl fmt::Display for DeviceSpec {
    /// The command-line form; the slot only when it is not the root bus (so a device's name in
    /// records and errors stays what it was before slots existed).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.backend)?;
        if self.slot != Slot::Root {
            write!(f, ",slot={}", self.slot)?;
        }
        if !self.plugged {
            f.write_str(",plugged=false")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_forms_parse_and_print_back() {
        for text in [
            "vfio=0000:63:00.0",
            "vfio-user=/tmp/x.sock",
            "vfio-user=/tmp/x.sock,slot=thunderbolt",
            "vfio-user=/tmp/x.sock,slot=thunderbolt,plugged=false",
        ] {
            assert_eq!(text.parse::<DeviceSpec>().unwrap().to_string(), text);
        }
        assert_eq!("vfio-user=/tmp/x.sock".parse::<DeviceSpec>(), Ok(DeviceSpec::vfio_user("/tmp/x.sock")));
        let placed = "vfio=0000:63:00.0,slot=root".parse::<DeviceSpec>().unwrap();
        assert_eq!((placed.slot, placed.to_string().as_str()), (Slot::Root, "vfio=0000:63:00.0"));
        let cases = [
            ("vfio=63:00", "not a PCI address"),
            ("usb=1", "vfio-user="),
            ("vfio-user=", "vfio-user="),
            ("vfio-user=/a,slot=usb4", "slot \"usb4\": write slot=root or slot=thunderbolt"),
            ("vfio-user=/a,speed=1", "unknown option \"speed=1\""),
            ("vfio-user=/a,plugged=false", "the root bus has no hot-plug slot"),
            ("vfio-user=/a,slot=thunderbolt,plugged=no", "unknown option \"plugged=no\""),
        ];
        for (text, expected) in cases {
            let err = text.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn json_keeps_the_old_form_and_adds_the_slot_only_when_there_is_one() {
        let old: DeviceSpec = serde_json::from_str(r#"{"vfio-user":"/a"}"#).unwrap();
        assert_eq!(serde_json::to_string(&old).unwrap(), r#"{"vfio-user":"/a"}"#);
        let placed: DeviceSpec = serde_json::from_str(r#"{"vfio":"0000:63:00.0","slot":"thunderbolt"}"#).unwrap();
        assert_eq!(placed.slot, Slot::Thunderbolt);
        assert_eq!(serde_json::to_string(&placed).unwrap(), r#"{"vfio":"0000:63:00.0","slot":"thunderbolt"}"#);
        let later = placed.plugged_later();
        let json = serde_json::to_string(&later).unwrap();
        assert_eq!(json, r#"{"vfio":"0000:63:00.0","slot":"thunderbolt","plugged":false}"#);
        assert_eq!(serde_json::from_str::<DeviceSpec>(&json).unwrap(), later);
        let cases = [
            (r#"{"vfio":"0000:63:00.0","vfio-user":"/a"}"#, "exactly one"),
            (r#"{"slot":"root"}"#, "exactly one"),
            (r#"{"vfio-user":""}"#, "the socket path is empty"),
            (r#"{"vfio-user":"/a","slot":"pcie"}"#, "unknown variant `pcie`"),
            (r#"{"vfio-user":"/a","plugged":false}"#, "the root bus has no hot-plug slot"),
            (r#"{"usb":"1"}"#, "unknown field `usb`"),
        ];
        for (json, expected) in cases {
            let err = serde_json::from_str::<DeviceSpec>(json).unwrap_err().to_string();
            assert!(err.contains(expected), "{json}: {err}");
        }
    }
}
