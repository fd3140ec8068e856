//! Devices in the database: the exclusive leases runs take on host devices, quarantines, and
//! the devices registered with the daemon.

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use super::processes::{holder_alive, host_name};
use super::{ResultsDb, ResultsDbError};
use crate::record::now_rfc3339;

/// Who holds a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The run.
    pub run: String,
    /// Its lab process.
    pub pid: u32,
    /// Its host.
    pub host: String,
}

impl ResultsDb {
    /// Takes the exclusive lease on `device` for `run`, or says who holds it. A lease whose holder
    /// on this host is gone is taken over.
    pub fn acquire(&mut self, device: &str, run: &str) -> Result<Result<(), LeaseHolder>, ResultsDbError> {
        let sql = self.sql();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&sql)?;
        let holder: Option<(String, String, u32, String)> = tx
            .query_row("SELECT run_id, host, pid, acquired_at FROM leases WHERE device = ?1", params![device], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()
            .map_err(&sql)?;
        let me = std::process::id();
        let host = host_name();
        if let Some((holder_run, holder_host, pid, acquired_at)) = holder {
            let ours = holder_run == run && pid == me && holder_host == host;
            let stale = !holder_alive(&holder_host, pid, &acquired_at);
            if !ours && !stale {
                return Ok(Err(LeaseHolder { run: holder_run, pid, host: holder_host }));
            }
        }
        tx.execute(
            "INSERT OR REPLACE INTO leases (device, run_id, host, pid, acquired_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![device, run, host, me, now_rfc3339()],
        )
        .map_err(&sql)?;
        tx.commit().map_err(&sql)?;
        Ok(Ok(()))
    }

    /// Gives a lease back.
    pub fn release(&self, device: &str, run: &str) -> Result<(), ResultsDbError> {
        self.conn
            .execute(
                "DELETE FROM leases WHERE device = ?1 AND run_id = ?2 AND pid = ?3",
                params![device, run, std::process::id()],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// The leases held now: device, holder. A lease whose holder on this host is gone (the
    /// next [`ResultsDb::acquire`] takes it over) is not held.
    pub fn leases(&self) -> Result<Vec<(String, LeaseHolder)>, ResultsDbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT device, run_id, pid, host, acquired_at FROM leases ORDER BY device")
            .map_err(self.sql())?;
        let rows = stmt
            .query_map([], |r| {
                let holder = LeaseHolder { run: r.get(1)?, pid: r.get(2)?, host: r.get(3)? };
                let acquired_at: String = r.get(4)?;
                Ok((r.get::<_, String>(0)?, holder, acquired_at))
            })
            .map_err(self.sql())?;
        let mut held = Vec::new();
        for row in rows {
            let (device, holder, acquired_at) = row.map_err(self.sql())?;
            if holder_alive(&holder.host, holder.pid, &acquired_at) {
                held.push((device, holder));
            }
        }
        Ok(held)
    }

    /// Quarantines a host device: no run uses it until it is released.
    pub fn quarantine(&self, device: &str, reason: &str) -> Result<(), ResultsDbError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO quarantine (device, reason, since) VALUES (?1, ?2, ?3)",
                params![device, reason, now_rfc3339()],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Why a device is quarantined, if it is.
    pub fn quarantined(&self, device: &str) -> Result<Option<String>, ResultsDbError> {
        self.conn
            .query_row("SELECT reason FROM quarantine WHERE device = ?1", params![device], |r| r.get(0))
            .optional()
            .map_err(self.sql())
    }

    /// Every quarantined device: device, reason, since.
    pub fn quarantine_list(&self) -> Result<Vec<(String, String, String)>, ResultsDbError> {
        let mut stmt =
            self.conn.prepare("SELECT device, reason, since FROM quarantine ORDER BY device").map_err(self.sql())?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

    /// Lifts a quarantine; returns whether there was one.
    pub fn unquarantine(&self, device: &str) -> Result<bool, ResultsDbError> {
        let n = self.conn.execute("DELETE FROM quarantine WHERE device = ?1", params![device]).map_err(self.sql())?;
        Ok(n > 0)
    }

    /// Registers `device` under its name; false if that name is taken.
    pub fn register_device(&self, device: &crate::matrix::Device) -> Result<bool, ResultsDbError> {
        let json = serde_json::to_string(device).expect("a device always serializes");
        let n = self
            .conn
            .execute(
                "INSERT OR IGNORE INTO devices (name, definition, registered_at) VALUES (?1, ?2, ?3)",
                params![device.name, json, now_rfc3339()],
            )
            .map_err(self.sql())?;
        Ok(n > 0)
    }

    /// The registered devices, by name, with when each was registered.
    pub fn devices(&self) -> Result<Vec<(crate::matrix::Device, String)>, ResultsDbError> {
        let mut stmt =
            self.conn.prepare("SELECT definition, registered_at FROM devices ORDER BY name").map_err(self.sql())?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(self.sql())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.sql())?;
        rows.into_iter()
            .map(|(json, at)| {
                serde_json::from_str(&json).map(|d| (d, at)).map_err(|e| ResultsDbError::Corrupt {
                    run: String::new(),
                    what: "devices",
                    reason: e.to_string(),
                })
            })
            .collect()
    }

    /// The registered device `name`.
    pub fn device(&self, name: &str) -> Result<Option<crate::matrix::Device>, ResultsDbError> {
        Ok(self.devices()?.into_iter().map(|(d, _)| d).find(|d| d.name == name))
    }

    /// Removes the registered device `name`; returns whether there was one.
    pub fn remove_device(&self, name: &str) -> Result<bool, ResultsDbError> {
        let n = self.conn.execute("DELETE FROM devices WHERE name = ?1", params![name]).map_err(self.sql())?;
        Ok(n > 0)
    }
}
