//! A matrix's `[[device]]` as written (the same type serves the results database and the API),
//! and its check into the typed [`DeviceSource`].

use serde::{Deserialize, Serialize};
use vm_spec::Bdf;

use super::{DeviceSource, HostPeer, Wire};

/// A device the cells run on: a driverlab model (a fresh process per VM) or a host PCI device.
///
/// One type serves the matrix's TOML, the results store and the HTTP API (`POST /v1/devices`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Its name in the matrix and in results.
    pub name: String,
    /// A driverlab model (`aqc100` or `lan743x`), a fresh process per VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<vm_spec::NicKind>,
    /// The model's frame generator (`driverlab model aqc100 --generate`), e.g. `size=1514`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate: Option<String>,
    /// The model's TAP interface (`--tap`), instead of the generator (a host resource: the
    /// daemon registers it only over its Unix socket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tap: Option<String>,
    /// A host PCI device bound to vfio-pci, `0000:63:00.0` (registered over the Unix socket only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "0000:63:00.0")]
    pub bdf: Option<Bdf>,
    /// Where the guest sees it: `root` (on the root bus, trusted) or `thunderbolt` (behind an
    /// external-facing root port with a hot-plug slot: untrusted, strict IOMMU, bounced DMA)
    /// [default: root; a host device in a Linux cell mirrors the host: a device its kernel takes
    /// for removable goes into a Thunderbolt slot]. A matrix that names a
    /// registered device may give its slot beside the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<vm_spec::Slot>,
    /// The Linux driver that drives it in Linux images [default: the model's (`atlantic` for the
    /// AQC100, `lan743x` for the LAN7430); for a host device, `atlantic`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// A host device's traffic peer for iperf3: an SSH destination (`[user@]host`, key login)
    /// on the NIC's wire that has iperf3 (registered over the Unix socket only). A model's peer is
    /// a namespace the lab makes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The peer's IPv4 address on the wire [default: 10.77.0.1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_ip: Option<String>,
    /// The guest's IPv4 address and prefix on the wire [default: 10.77.0.2/24].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_ip: Option<String>,
    /// The peer's IPv6 address on the wire [default: fd77::1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_ip6: Option<String>,
    /// The guest's IPv6 address and prefix on the wire [default: fd77::2/64].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_ip6: Option<String>,
    /// The peer also serves the device's model counters (`driverlab model counters` over SSH):
    /// the nested lab box's cards, which are models on the host [default: false].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub peer_counters: bool,
}

/// Why a name is no network interface name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterfaceNameError {
    /// Empty, or longer than IFNAMSIZ less its NUL.
    #[error("{0} bytes; an interface name is 1 to 15")]
    Length(usize),
    /// A character Linux refuses, or `.` or `..`.
    #[error("not an interface name: no '/', ':', spaces or control characters, not . or ..")]
    Characters,
}

/// Whether `name` is a network interface name Linux takes: 1 to 15 bytes (IFNAMSIZ less its
/// NUL), none of them `/`, `:`, whitespace or control characters, and not `.` or `..`.
pub fn interface_name(name: &str) -> Result<(), InterfaceNameError> {
    if name.is_empty() || name.len() > 15 {
        return Err(InterfaceNameError::Length(name.len()));
    }
    if name == "." || name == ".." || name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(InterfaceNameError::Characters);
    }
    Ok(())
}

impl Device {
    /// The NIC it is, where the lab knows it: the model's kind, or the chip its Linux driver
    /// drives.
    pub fn nic(&self) -> Option<vm_spec::NicKind> {
        self.model.or_else(|| vm_spec::NicKind::from_linux_driver(&self.linux_driver()))
    }

    /// Checks the device on its own; the error is the field (after `device[i]`) and what is
    /// wrong.
    pub fn check(&self) -> Result<(), (String, String)> {
        self.source().map(drop)
    }

    /// What the device is, from its fields, checked; the error is the field (after
    /// `device[i]`) and what is wrong.
    pub fn source(&self) -> Result<DeviceSource, (String, String)> {
        let fail = |field: &str, message: String| Err((field.to_string(), message));
        let peer = match &self.peer {
            Some(_) if self.model.is_some() => {
                return fail(
                    ".peer",
                    "a model's peer is a network namespace the lab makes; peer is for host devices".into(),
                );
            }
            Some(peer) if !ssh_destination(peer) => {
                return fail(
                    ".peer",
                    format!("{peer:?} is not an SSH destination: give [user@]host (letters, digits, . - _)"),
                );
            }
            Some(peer) => Some(peer.clone()),
            None if self.peer_counters => {
                return fail(".peer_counters", "the counters come from the device's peer: give peer too".into());
            }
            None if self.peer_ip.is_some()
                || self.guest_ip.is_some()
                || self.peer_ip6.is_some()
                || self.guest_ip6.is_some() =>
            {
                return fail("", "addresses are for a device with a peer".into());
            }
            None => None,
        };
        let checks: [AddressCheck; 4] = [
            ("peer_ip", &self.peer_ip, |a| a.parse::<std::net::Ipv4Addr>().is_ok(), "an IPv4 address"),
            ("guest_ip", &self.guest_ip, |a| with_prefix::<std::net::Ipv4Addr>(a, 32), "IPv4/prefix"),
            ("peer_ip6", &self.peer_ip6, |a| a.parse::<std::net::Ipv6Addr>().is_ok(), "an IPv6 address"),
            ("guest_ip6", &self.guest_ip6, |a| with_prefix::<std::net::Ipv6Addr>(a, 128), "IPv6/prefix"),
        ];
        for (field, value, valid, what) in checks {
            if let Some(value) = value
                && !valid(value)
            {
                return fail(&format!(".{field}"), format!("{value:?}: give {what}"));
            }
        }
        match (self.model, self.bdf) {
            (Some(_), Some(_)) | (None, None) => fail("", "give either model or bdf".into()),
            (None, Some(_)) if self.generate.is_some() || self.tap.is_some() => {
                fail("", "generate and tap are for models".into())
            }
            (None, Some(bdf)) => Ok(DeviceSource::Host {
                bdf,
                peer: peer.map(|destination| HostPeer {
                    destination,
                    addresses: self.addresses(),
                    counters: self.peer_counters,
                }),
            }),
            (Some(nic), None) => {
                let wire = match (&self.generate, &self.tap) {
                    (Some(_), Some(_)) => return fail("", "give generate or tap, not both".into()),
                    (None, Some(tap)) => match interface_name(tap) {
                        Ok(()) => Wire::Tap(tap.clone()),
                        Err(e) => return fail(".tap", format!("{tap:?}: {e}")),
                    },
                    (generate, None) => match generate.as_deref().unwrap_or_default().parse() {
                        Ok(config) => Wire::Generator(config),
                        Err(e) => return fail(".generate", format!("{:?}: {e}", generate.as_deref().unwrap_or(""))),
                    },
                };
                Ok(DeviceSource::Model { nic, wire })
            }
        }
    }

    /// What leases and quarantines a host device: `vfio=BDF`. Models have none (a fresh
    /// process per VM holds nothing).
    pub fn lease_key(&self) -> Option<String> {
        match (self.model, self.bdf) {
            (None, Some(bdf)) => Some(vm_spec::DeviceSpec::vfio(bdf).to_string()),
            _ => None,
        }
    }

    /// The guest's and the peer's addresses: the device's, else the defaults.
    pub fn addresses(&self) -> engines::peer::Addresses {
        let default = engines::peer::Addresses::default();
        let or = |value: &Option<String>, default: String| value.clone().unwrap_or(default);
        engines::peer::Addresses {
            guest_v4: or(&self.guest_ip, default.guest_v4),
            peer_v4: or(&self.peer_ip, default.peer_v4),
            guest_v6: or(&self.guest_ip6, default.guest_v6),
            peer_v6: or(&self.peer_ip6, default.peer_v6),
        }
    }

    /// The Linux driver of the device: the one named, else the model's, else `atlantic`.
    pub fn linux_driver(&self) -> String {
        match (&self.driver, self.model) {
            (Some(driver), _) => driver.clone(),
            (None, Some(nic)) => nic.linux_driver().into(),
            (None, None) => vm_spec::NicKind::Aqc100.linux_driver().into(),
        }
    }
}

/// A device's address field: its name, its value, what makes it valid, and what it should be.
type AddressCheck<'a> = (&'static str, &'a Option<String>, fn(&str) -> bool, &'static str);

/// `[user@]host` with nothing SSH could take for an option.
fn ssh_destination(text: &str) -> bool {
    let (user, host) = text.split_once('@').unwrap_or(("", text));
    let word = |w: &str| w.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    !host.is_empty() && !host.starts_with('-') && !user.starts_with('-') && word(user) && word(host)
}

/// `ADDRESS/PREFIX`, the prefix at most `max`.
fn with_prefix<A: std::str::FromStr>(text: &str, max: u8) -> bool {
    text.split_once('/').is_some_and(|(a, p)| a.parse::<A>().is_ok() && p.parse::<u8>().is_ok_and(|p| p <= max))
}
