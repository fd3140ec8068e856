//! A matrix that arrives over the API (TOML, or the same as JSON). It names no host resource:
//! its images are the probe or image IDs from the store, and its devices are either a model
//! with its frame generator or a device registered with the daemon, named alone. The registered
//! definitions are written into the matrix, so the run stores (and resumes from) the matrix as
//! it ran.

use std::path::Path;

use crate::matrix::{Device, MatrixError, Plan};

/// The name a matrix from the API has in errors and in the run.
pub const REQUEST_FILE: &str = "request.toml";

/// Device fields a matrix from the API may give inline: a model on its generator.
const INLINE_DEVICE_FIELDS: &[&str] = &["name", "model", "generate", "driver"];

fn error(field: impl Into<String>, message: impl Into<String>) -> MatrixError {
    MatrixError { file: REQUEST_FILE.into(), line: None, field: field.into(), message: message.into() }
}

/// A matrix in TOML, as a table.
pub fn from_toml(text: &str) -> Result<toml::Table, MatrixError> {
    toml::from_str(text).map_err(|e| MatrixError {
        file: REQUEST_FILE.into(),
        line: e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1),
        field: "syntax".into(),
        message: e.message().to_string(),
    })
}

/// A matrix in JSON (the TOML's tables and arrays as objects and arrays), as a table.
pub fn from_json(value: serde_json::Value) -> Result<toml::Table, MatrixError> {
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
    toml::Table::try_from(strip_nulls(value)).map_err(|e| error("matrix", format!("not a matrix: {e}")))
}

/// Checks that `matrix` names no host resource, fills in its registered devices (`registered`
/// gives a device by name), and checks and expands it.
pub fn plan(mut matrix: toml::Table, registered: &dyn Fn(&str) -> Option<Device>) -> Result<Plan, MatrixError> {
    if let Some(images) = matrix.get("image").and_then(toml::Value::as_array) {
        for (i, image) in images.iter().enumerate() {
            let kernel = image.get("kernel").and_then(toml::Value::as_str).unwrap_or_default();
            if kernel != "probe" && !crate::images::is_id(kernel, "kernel") {
                return Err(error(
                    format!("image[{i}].kernel"),
                    format!(
                        "{kernel:?}: over the API a kernel is `probe` or a kernel image's ID (GET /v1/images); \
                         the server's owner adds images with `driverlab image kernel`"
                    ),
                ));
            }
            if image.get("patches").is_some() {
                return Err(error(
                    format!("image[{i}].patches"),
                    "patches are files on the server: build the variant with POST /v1/images/module and \
                     /v1/images/initramfs, and give the initramfs image's ID as initrd",
                ));
            }
            if let Some(initrd) = image.get("initrd") {
                let initrd = initrd.as_str().unwrap_or_default();
                if !crate::images::is_id(initrd, "initramfs") {
                    return Err(error(
                        format!("image[{i}].initrd"),
                        format!("{initrd:?}: over the API an initrd is an initramfs image's ID (GET /v1/images)"),
                    ));
                }
            }
        }
    }
    if let Some(devices) = matrix.get_mut("device").and_then(toml::Value::as_array_mut) {
        for (i, device) in devices.iter_mut().enumerate() {
            let Some(table) = device.as_table() else { continue };
            let name = table.get("name").and_then(toml::Value::as_str).unwrap_or_default().to_string();
            if table.len() == 1 && !name.is_empty() {
                let found = registered(&name).ok_or_else(|| {
                    error(format!("device[{i}].name"), format!("no device is registered as {name:?} (GET /v1/devices)"))
                })?;
                *device = toml::Value::try_from(&found).expect("a device is a table");
                continue;
            }
            if let Some(field) = table.keys().find(|k| !INLINE_DEVICE_FIELDS.contains(&k.as_str())) {
                return Err(error(
                    format!("device[{i}].{field}"),
                    "names a host resource: register the device (POST /v1/devices, over the server's Unix socket) \
                     and give only its name here",
                ));
            }
        }
    }
    let text = toml::to_string(&matrix).map_err(|e| error("matrix", format!("not a matrix: {e}")))?;
    // Lines would point into the matrix as rewritten; the fields say where.
    Plan::parse(Path::new(REQUEST_FILE), &text).map_err(|e| MatrixError { line: None, ..e })
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
        let json = serde_json::to_value(from_toml(PROBE).unwrap()).unwrap();
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
    fn json_that_is_no_matrix_is_refused_with_a_reason() {
        assert_eq!(from_json(serde_json::json!([1, 2])).unwrap_err().field, "matrix");
        let err = plan(from_json(serde_json::json!({"name": "m", "repetitions": "x"})).unwrap(), &none).unwrap_err();
        assert_eq!(err.field, "syntax", "{err}");
    }
}
