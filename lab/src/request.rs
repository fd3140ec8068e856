//! A matrix that arrives over the API (TOML, or the same as JSON). It names no host resource:
//! its images are the probe, image IDs from the store or recipes the daemon builds (`kernel =
//! "debian"`, `initrd = "agent"` with its patches' names and texts, never their paths), and its
//! devices are either a model with its frame generator or a device registered with the daemon,
//! named alone. The registered definitions are written into the matrix, so the run stores (and
//! resumes from) the matrix as it ran.
//!
//! Both forms parse into the typed [`Matrix`]; the API's rules are checked on its fields.

use std::path::Path;

use crate::matrix::{Device, Image, InitrdRef, KernelRef, Matrix, MatrixError, MatrixErrorKind, PatchRef, Plan};

/// The name a matrix from the API has in errors and in the run.
pub const REQUEST_FILE: &str = "request.toml";

fn error(field: impl Into<String>, message: impl Into<String>) -> MatrixError {
    MatrixError {
        kind: MatrixErrorKind::Invalid,
        file: REQUEST_FILE.into(),
        line: None,
        field: field.into(),
        message: message.into(),
    }
}

/// A matrix from a request, parsed, not yet checked.
#[derive(Debug, Clone)]
pub struct Request {
    matrix: Matrix,
    /// The TOML text as sent, whose lines errors give; none for JSON.
    text: Option<String>,
}

/// A matrix in TOML.
pub fn from_toml(text: &str) -> Result<Request, MatrixError> {
    let matrix = Matrix::from_toml(Path::new(REQUEST_FILE), text)?;
    Ok(Request { matrix, text: Some(text.to_string()) })
}

/// A matrix in JSON (the TOML's tables and arrays as objects and arrays).
pub fn from_json(value: serde_json::Value) -> Result<Request, MatrixError> {
    if !value.is_object() {
        return Err(error("matrix", "a JSON matrix is an object"));
    }
    // JSON null has no TOML form; a field left out means the same.
    fn strip_nulls(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => serde_json::Value::Object(
                map.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, strip_nulls(v))).collect(),
            ),
            serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(strip_nulls).collect()),
            other => other,
        }
    }
    // Through TOML's own parser, which gives the matrix's spans (of text nobody sent, so errors
    // give fields, not lines).
    let text = toml::Table::try_from(strip_nulls(value))
        .and_then(|table| toml::to_string(&table))
        .map_err(|e| error("matrix", format!("not a matrix: {e}")))?;
    let matrix = Matrix::from_toml(Path::new(REQUEST_FILE), &text).map_err(|e| MatrixError { line: None, ..e })?;
    Ok(Request { matrix, text: None })
}

/// Whether `device` is a name alone (with a slot, perhaps): a registered device.
fn name_alone(device: &Device) -> bool {
    *device == Device { name: device.name.clone(), slot: device.slot, ..Device::default() }
}

/// The field of `device` that names a host resource, if one does: what only a registered
/// device may have.
fn host_field(device: &Device) -> Option<&'static str> {
    [
        ("tap", device.tap.is_some()),
        ("bdf", device.bdf.is_some()),
        ("peer", device.peer.is_some()),
        ("peer_ip", device.peer_ip.is_some()),
        ("guest_ip", device.guest_ip.is_some()),
        ("peer_ip6", device.peer_ip6.is_some()),
        ("guest_ip6", device.guest_ip6.is_some()),
        ("peer_counters", device.peer_counters),
    ]
    .into_iter()
    .find_map(|(field, given)| given.then_some(field))
}

/// Checks that image `i` names no host file: its kernel is the probe, an image ID or a Debian
/// recipe; its initrd an image ID or the agent's recipe; its patches texts.
fn check_image(i: usize, image: &Image) -> Result<(), MatrixError> {
    if let KernelRef::Path(path) = &image.kernel {
        return Err(error(
            format!("image[{i}].kernel"),
            format!(
                "{:?}: over the API a kernel is `probe`, `debian`, `debian:PACKAGE` or a kernel image's ID \
                 (GET /v1/images), never a file of the server's",
                path.display().to_string()
            ),
        ));
    }
    if let Some(InitrdRef::Path(path)) = &image.initrd {
        return Err(error(
            format!("image[{i}].initrd"),
            format!(
                "{:?}: over the API an initrd is `agent` or an initramfs image's ID (GET /v1/images)",
                path.display().to_string()
            ),
        ));
    }
    let paths = [("patches", &image.patches), ("series", &image.series)].into_iter().find_map(|(field, refs)| {
        refs.iter().position(|p| matches!(p, PatchRef::Path(_))).map(|j| format!("image[{i}].{field}[{j}]"))
    });
    if let Some(field) = paths {
        return Err(error(
            field,
            "a path: over the API a patch is its file's name and text, `{ name = \"...\", text = \"...\" }` \
             (`driverlab lab run --url` sends them so)",
        ));
    }
    Ok(())
}

/// Checks that the request names no host resource, fills in its registered devices
/// (`registered` gives a device by name), and checks and expands it.
pub fn plan(request: Request, registered: &dyn Fn(&str) -> Option<Device>) -> Result<Plan, MatrixError> {
    let Request { mut matrix, text } = request;
    for (i, image) in matrix.images.iter().map(|i| i.get_ref()).enumerate() {
        check_image(i, image)?;
    }
    let mut filled = false;
    for (i, device) in matrix.devices.iter_mut().enumerate() {
        let span = device.span();
        let inline = device.get_mut();
        if name_alone(inline) && !inline.name.is_empty() {
            let found = registered(&inline.name).ok_or_else(|| {
                error(
                    format!("device[{i}].name"),
                    format!("no device is registered as {:?} (GET /v1/devices)", inline.name),
                )
            })?;
            let slot = inline.slot.or(found.slot);
            *device = toml::Spanned::new(span, Device { slot, ..found });
            filled = true;
        } else if let Some(field) = host_field(inline) {
            return Err(error(
                format!("device[{i}].{field}"),
                "names a host resource: register the device (POST /v1/devices, over the server's Unix socket) \
                 and give only its name here",
            ));
        }
    }
    // The run stores the matrix as it runs: as sent, or with the registered devices written in.
    let stored = match (&text, filled) {
        (Some(text), false) => text.clone(),
        _ => matrix.to_toml().map_err(|e| error("matrix", format!("not a matrix: {e}")))?,
    };
    Plan::from_matrix(Path::new(REQUEST_FILE), matrix, stored, text.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROBE: &str = "name = \"m\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n[[image]]\nname = \"probe\"\n\
                         kernel = \"probe\"\n[[variant]]\nname = \"flip\"\nimage = \"probe\"\n\
                         params = { \"probe.rx\" = \"flip\" }\n[[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\nframes = 100\n";

    fn none(_: &str) -> Option<Device> {
        None
    }

    #[test]
    fn a_probe_matrix_in_toml_or_json_gives_the_same_cells() {
        let from_text = plan(from_toml(PROBE).unwrap(), &none).unwrap();
        let json = serde_json::to_value(toml::from_str::<toml::Table>(PROBE).unwrap()).unwrap();
        let from_json = plan(from_json(json).unwrap(), &none).unwrap();
        assert_eq!(from_text.cells, from_json.cells);
        assert_eq!(from_text.cells[0].key(), "probe/flip[probe.rx=flip]/rx/aq");
        assert_eq!(from_text.file, Path::new(REQUEST_FILE));
        // What the run stores parses again as it is (resume).
        assert_eq!(Plan::parse(Path::new(REQUEST_FILE), &from_text.text).unwrap().cells, from_text.cells);
    }

    #[test]
    fn host_paths_and_host_devices_are_refused_and_registered_devices_filled_in() {
        for (text, field) in [
            (PROBE.replace("kernel = \"probe\"", "kernel = \"/etc/shadow\""), "image[0].kernel"),
            (PROBE.replace("kernel = \"probe\"", "kernel = \"kernel-xyz\""), "image[0].kernel"),
            (
                PROBE.replace("kernel = \"probe\"", "kernel = \"kernel-0123456789abcdef\"\ninitrd = \"../x\""),
                "image[0].initrd",
            ),
            (PROBE.replace("model = \"aqc100\"", "model = \"aqc100\"\ntap = \"eth0\""), "device[0].tap"),
            (PROBE.replace("model = \"aqc100\"", "bdf = \"0000:63:00.0\""), "device[0].bdf"),
            (PROBE.replace("model = \"aqc100\"", "model = \"aqc100\"\npeer = \"root@x\""), "device[0].peer"),
        ] {
            let err = plan(from_toml(&text).unwrap(), &none).unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(!err.message.contains("root:"), "no file's bytes in {err}");
        }
        let named = PROBE.replace("name = \"aq\"\nmodel = \"aqc100\"", "name = \"lab-nic\"");
        assert_eq!(plan(from_toml(&named).unwrap(), &none).unwrap_err().field, "device[0].name");
        let registered = |name: &str| {
            (name == "lab-nic").then(|| Device {
                name: "lab-nic".into(),
                bdf: Some("0000:63:00.0".parse().unwrap()),
                ..Device::default()
            })
        };
        let plan = plan(from_toml(&named).unwrap(), &registered).unwrap();
        assert_eq!(plan.device("lab-nic").unwrap().bdf, Some("0000:63:00.0".parse().unwrap()));
        assert!(plan.text.contains("bdf = \"0000:63:00.0\""), "{}", plan.text);
    }

    #[test]
    fn recipes_are_taken_with_their_patches_texts_and_a_patch_path_is_not() {
        let recipe = PROBE
            .replace(
                "kernel = \"probe\"",
                "kernel = \"debian\"\ninitrd = \"agent\"\npatches = [{ name = \"000.patch\", text = \"Subject: x\" }]",
            )
            .replace("params = { \"probe.rx\" = \"flip\" }\n", "")
            .replace("kind = \"probe-rx\"\nframes = 100", "kind = \"iperf3\"\nduration_s = 5");
        let planned = plan(from_toml(&recipe).unwrap(), &none).unwrap();
        let image = planned.matrix.images[0].get_ref();
        assert_eq!(image.kernel, KernelRef::Debian { package: None });
        assert!(matches!(&image.patches[0], PatchRef::Text(f) if f.text == "Subject: x"));
        // What the run stores parses again, texts and all (resume).
        assert_eq!(
            Plan::parse(Path::new(REQUEST_FILE), &planned.text).unwrap().matrix.images[0].get_ref().patches.len(),
            1
        );
        let by_path = recipe.replace("{ name = \"000.patch\", text = \"Subject: x\" }", "\"/etc/shadow\"");
        let err = plan(from_toml(&by_path).unwrap(), &none).unwrap_err();
        assert_eq!(err.field, "image[0].patches[0]", "{err}");
        assert!(err.message.contains("name and text"), "{err}");
        let initrd_path = recipe.replace("initrd = \"agent\"", "initrd = \"/boot/initrd.img\"");
        assert_eq!(plan(from_toml(&initrd_path).unwrap(), &none).unwrap_err().field, "image[0].initrd");
    }

    #[test]
    fn a_registered_device_named_with_a_slot_takes_that_slot() {
        let linux = PROBE
            .replace("kernel = \"probe\"", "kernel = \"debian\"\ninitrd = \"agent\"")
            .replace("params = { \"probe.rx\" = \"flip\" }\n", "")
            .replace("kind = \"probe-rx\"\nframes = 100", "kind = \"iperf3\"");
        let registered = |name: &str| {
            (name == "lab-nic").then(|| Device {
                name: "lab-nic".into(),
                bdf: Some("0000:63:00.0".parse().unwrap()),
                ..Device::default()
            })
        };
        let named =
            |extra: &str| linux.replace("name = \"aq\"\nmodel = \"aqc100\"", &format!("name = \"lab-nic\"{extra}"));
        let plain = plan(from_toml(&named("")).unwrap(), &registered).unwrap();
        assert_eq!(plain.device("lab-nic").unwrap().slot, None);
        let placed = plan(from_toml(&named("\nslot = \"thunderbolt\"")).unwrap(), &registered).unwrap();
        let device = placed.device("lab-nic").unwrap();
        assert_eq!(
            (device.slot, device.bdf),
            (Some(vm_spec::Slot::Thunderbolt), Some("0000:63:00.0".parse().unwrap()))
        );
        assert!(placed.text.contains("slot = \"thunderbolt\""), "{}", placed.text);
    }

    #[test]
    fn a_toml_request_keeps_its_lines_and_a_filled_in_matrix_parses_back() {
        let wrong = PROBE.replace("image = \"probe\"", "image = \"prob\"");
        let err = plan(from_toml(&wrong).unwrap(), &none).unwrap_err();
        assert_eq!((err.field.as_str(), err.line), ("variant[0].image", Some(10)), "{err}");
        let json = serde_json::to_value(toml::from_str::<toml::Table>(&wrong).unwrap()).unwrap();
        let err = plan(from_json(json).unwrap(), &none).unwrap_err();
        assert_eq!((err.field.as_str(), err.line), ("variant[0].image", None), "JSON has no lines: {err}");
        // A registered device written in: the stored text is the matrix as it ran, and parses
        // back into the same cells and device.
        let named = PROBE.replace("name = \"aq\"\nmodel = \"aqc100\"", "name = \"lan\"");
        let lan = Device {
            name: "lan".into(),
            model: Some(vm_spec::NicKind::Lan743x),
            generate: Some("size=60".into()),
            ..Device::default()
        };
        let planned = plan(from_toml(&named).unwrap(), &|n: &str| (n == "lan").then(|| lan.clone())).unwrap();
        let again = Plan::parse(Path::new(REQUEST_FILE), &planned.text).unwrap();
        assert_eq!((&again.cells, again.device("lan")), (&planned.cells, Some(&lan)));
    }

    #[test]
    fn json_that_is_no_matrix_is_refused_with_a_reason() {
        assert_eq!(from_json(serde_json::json!([1, 2])).unwrap_err().field, "matrix");
        let err = from_json(serde_json::json!({"name": "m", "repetitions": "x"})).unwrap_err();
        assert_eq!((err.field.as_str(), err.line), ("syntax", None), "{err}");
    }
}
