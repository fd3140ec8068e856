//! The QEMU engine's Thunderbolt slot: a `pcie-root-port` that firmware declares external-facing.
//!
//! QEMU's q35 DSDT gives every device on bus 0 a node named after its devfn (`\_SB.PCI0.S80` for
//! device 0x10, function 0: seen in a Linux 6.12 guest's `firmware_node/path` under QEMU 11.1)
//! but no `_DSD`. This SSDT, loaded with `-acpitable`, adds one to the port's node: the property
//! `ExternalFacingPort` = 1 under Microsoft's UUID, which Linux reads in
//! `pci_acpi_set_external_facing()` (drivers/pci/pci-acpi.c) and from which `set_pcie_untrusted()`
//! (drivers/pci/probe.c) marks every device below the port untrusted: a strict IOMMU domain and
//! unaligned maps bounced through swiotlb, as on the user's machine. QEMU's `_OSC` keeps native
//! hot-plug to itself (its root ports hot-plug through ACPI), so the slot is one that is occupied
//! at boot: the lab plugs nothing later and pulls nothing under this engine.

use acpi_tables::Aml;
use acpi_tables::aml;
use acpi_tables::sdt::Sdt;

/// The root port's device number on bus 0 (function 0): clear of q35's own devices (0, 0x1f)
/// and of the ones QEMU places in order from 1 (the virtio-iommu).
pub const ROOT_PORT_DEVICE: u8 = 0x10;
/// The root port's QEMU id, the bus its device names.
pub const ROOT_PORT_ID: &str = "thunderbolt0";
/// `_DSD` UUID of the external-facing-port property (Microsoft's, which Linux's
/// drivers/acpi/property.c `prp_guids` accepts).
const EXTERNAL_FACING_PORT_UUID: &str = "EFCC06CC-73AC-4BC3-BFF0-76143807C389";

/// The name of QEMU's DSDT node of the device at `device` (function 0) on bus 0: `S` and the
/// devfn in two upper-case hex digits, padded to four characters as AML names are.
pub fn qemu_node(device: u8) -> String {
    format!("\\_SB_.PCI0.S{:02X}_", device << 3)
}

/// The SSDT that makes QEMU's root port at [`ROOT_PORT_DEVICE`] external-facing.
pub fn external_facing_port() -> Vec<u8> {
    let uuid = aml::Uuid::new(EXTERNAL_FACING_PORT_UUID);
    let property = aml::Package::new(vec![&"ExternalFacingPort", &aml::ONE]);
    let properties = aml::Package::new(vec![&property]);
    let dsd_package = aml::Package::new(vec![&uuid, &properties]);
    let dsd = aml::Name::new("_DSD".into(), &dsd_package);
    let node = qemu_node(ROOT_PORT_DEVICE);
    let mut body = Vec::new();
    aml::Scope::new(node.as_str().into(), vec![&dsd]).to_aml_bytes(&mut body);
    let mut sdt = Sdt::new(*b"SSDT", 36, 2, *b"DRVLAB", *b"TBPORT  ", 1);
    sdt.append_slice(&body);
    sdt.as_slice().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_named_after_the_devfn_as_qemu_names_it() {
        assert_eq!(qemu_node(0x10), "\\_SB_.PCI0.S80_");
        assert_eq!(qemu_node(0x01), "\\_SB_.PCI0.S08_");
        assert_eq!(qemu_node(0x1f), "\\_SB_.PCI0.SF8_");
    }

    #[test]
    fn the_table_has_a_valid_header_and_checksum() {
        let table = external_facing_port();
        assert_eq!(&table[0..4], b"SSDT");
        let length = u32::from_le_bytes(table[4..8].try_into().unwrap()) as usize;
        assert_eq!(length, table.len());
        assert_eq!(table.iter().fold(0u8, |sum, b| sum.wrapping_add(*b)), 0, "the bytes sum to zero");
        let text = String::from_utf8_lossy(&table);
        assert!(text.contains("ExternalFacingPort") && text.contains("S80_"), "{text}");
    }

    /// iasl decodes the table to the scope and property Linux reads. `DRIVERLAB_IASL` names the
    /// iasl (scripts/test.sh fetches one); otherwise `iasl` from PATH.
    #[test]
    fn iasl_decodes_the_port_s_dsd() {
        let iasl = std::env::var_os("DRIVERLAB_IASL").unwrap_or_else(|| "iasl".into());
        if std::process::Command::new(&iasl).arg("-v").output().is_err() {
            let why = "no iasl (scripts/fetch-iasl.sh, or Debian's acpica-tools)";
            testkit::skip("iasl_decodes_the_port_s_dsd", testkit::Lacks::Setup, why);
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ssdt.dat");
        std::fs::write(&path, external_facing_port()).unwrap();
        let out = std::process::Command::new(&iasl).arg("-d").arg(&path).current_dir(dir.path()).output().unwrap();
        assert!(out.status.success(), "iasl -d: {}", String::from_utf8_lossy(&out.stderr));
        let dsl = std::fs::read_to_string(dir.path().join("ssdt.dsl")).unwrap();
        for expected in [
            "Scope (\\_SB.PCI0.S80)",
            "Name (_DSD, Package (0x02)",
            "ToUUID (\"efcc06cc-73ac-4bc3-bff0-76143807c389\")",
            "\"ExternalFacingPort\"",
        ] {
            assert!(dsl.contains(expected), "{expected:?} not in:\n{dsl}");
        }
    }
}
