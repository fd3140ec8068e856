//! A CMOS real-time clock (Motorola MC146818, as every PC has one) at ports 0x70 (index, with
//! the NMI-mask bit) and 0x71 (data): the time of day from the host's clock, the update-in-
//! progress bit as the chip sets it (during the last 244 µs before each second), BCD or binary
//! and 12- or 24-hour modes as register B selects, a guest that sets the clock moving only its
//! own offset from the host's, and the chip's RAM. No interrupts: register C never has a flag
//! set, so a guest that waits for one (an alarm, the update interrupt) waits in vain, as on a
//! board whose RTC IRQ is not wired.
//!
//! Linux's `rtc_cmos` (built into distribution kernels) probes these ports at boot; without a
//! device there it reads all ones, takes the update-in-progress bit as stuck, and retries for
//! seconds before it gives up.

use std::time::{Duration, SystemTime};

use vm_device::bus::BusDevice;

/// The index port.
pub const RTC_BASE: u64 = 0x70;
/// The index and the data port.
pub const RTC_LEN: u64 = 2;

const SECONDS: usize = 0x00;
const MINUTES: usize = 0x02;
const HOURS: usize = 0x04;
const WEEKDAY: usize = 0x06;
const DAY: usize = 0x07;
const MONTH: usize = 0x08;
const YEAR: usize = 0x09;
const REG_A: usize = 0x0a;
const REG_B: usize = 0x0b;
const REG_C: usize = 0x0c;
const REG_D: usize = 0x0d;
/// The century, where PCs keep it (the FADT's `century` field names it).
pub const CENTURY: usize = 0x32;

/// Register A: update in progress.
const A_UIP: u8 = 0x80;
/// Register B: the clock is being set (updates stop).
const B_SET: u8 = 0x80;
/// Register B: binary, not BCD.
const B_BINARY: u8 = 0x04;
/// Register B: 24-hour mode.
const B_24H: u8 = 0x02;
/// Register D: the RAM and time are valid (the battery is good).
const D_VRT: u8 = 0x80;
/// How long before each second the chip says it is updating.
const UIP_WINDOW: Duration = Duration::from_micros(244);

/// The time source: the duration since the UNIX epoch.
pub type Clock = Box<dyn Fn() -> Duration + Send>;

/// The RTC as a snapshot keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RtcState {
    /// The register the index port selects.
    pub index: u8,
    /// Whether NMIs are masked (bit 7 of the index port).
    pub nmi_masked: bool,
    /// The 128 bytes of registers and CMOS RAM.
    pub ram: Vec<u8>,
    /// The guest's time minus the host's, in seconds.
    pub offset_s: i64,
}

/// A saved RTC state that cannot be an RTC's.
#[derive(Debug, thiserror::Error)]
#[error("RTC state: {0} bytes of CMOS RAM, an RTC has 128")]
pub struct RtcStateError(usize);

/// The CMOS RTC and its RAM.
pub struct CmosRtc {
    index: usize,
    nmi_masked: bool,
    ram: [u8; 128],
    /// The guest's time minus the host's, in seconds (it moves when the guest sets the clock).
    offset_s: i64,
    clock: Clock,
}

/// The host's wall clock.
pub fn host_clock() -> Clock {
    Box::new(|| SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default())
}

impl Default for CmosRtc {
    fn default() -> Self {
        CmosRtc::new(host_clock())
    }
}

impl CmosRtc {
    /// An RTC reading `clock`, in the state a PC's firmware leaves it: BCD, 24-hour mode, the
    /// 32.768 kHz time base with a 1024 Hz periodic rate, valid RAM and time.
    pub fn new(clock: Clock) -> CmosRtc {
        let mut ram = [0u8; 128];
        ram[REG_A] = 0x26;
        ram[REG_B] = B_24H;
        ram[REG_D] = D_VRT;
        CmosRtc { index: 0, nmi_masked: false, ram, offset_s: 0, clock }
    }

    /// Its registers, RAM and the guest's offset from the host's clock, as a snapshot keeps them.
    pub fn state(&self) -> RtcState {
        RtcState {
            index: self.index as u8,
            nmi_masked: self.nmi_masked,
            ram: self.ram.to_vec(),
            offset_s: self.offset_s,
        }
    }

    /// An RTC reading `clock` in a saved state: the guest's time goes on from the host's now
    /// plus the offset the guest had set, so a restored guest's wall clock is stepped to now.
    pub fn from_state(state: &RtcState, clock: Clock) -> Result<CmosRtc, RtcStateError> {
        let ram: [u8; 128] = state.ram.as_slice().try_into().map_err(|_| RtcStateError(state.ram.len()))?;
        Ok(CmosRtc {
            index: (state.index & 0x7f) as usize,
            nmi_masked: state.nmi_masked,
            ram,
            offset_s: state.offset_s,
            clock,
        })
    }

    /// Whether the guest masked NMIs through bit 7 of the index port.
    pub fn nmi_masked(&self) -> bool {
        self.nmi_masked
    }

    fn now(&self) -> (i64, Duration) {
        let host = (self.clock)();
        (host.as_secs() as i64 + self.offset_s, Duration::from_nanos(host.subsec_nanos() as u64))
    }

    fn encode(&self, value: u8) -> u8 {
        if self.ram[REG_B] & B_BINARY != 0 { value } else { ((value / 10) << 4) | (value % 10) }
    }

    fn decode(&self, value: u8) -> u8 {
        if self.ram[REG_B] & B_BINARY != 0 { value } else { (value >> 4) * 10 + (value & 0x0f) }
    }

    fn read_register(&mut self, index: usize) -> u8 {
        let setting = self.ram[REG_B] & B_SET != 0;
        match index {
            SECONDS | MINUTES | HOURS | WEEKDAY | DAY | MONTH | YEAR | CENTURY if !setting => {
                let (secs, _) = self.now();
                let t = Civil::from_unix(secs);
                match index {
                    SECONDS => self.encode(t.second),
                    MINUTES => self.encode(t.minute),
                    HOURS => self.hour(t.hour),
                    WEEKDAY => self.encode(t.weekday),
                    DAY => self.encode(t.day),
                    MONTH => self.encode(t.month),
                    YEAR => self.encode((t.year % 100) as u8),
                    _ => self.encode((t.year / 100) as u8),
                }
            }
            REG_A => {
                let (_, fraction) = self.now();
                let updating = !setting && fraction >= Duration::from_secs(1) - UIP_WINDOW;
                self.ram[REG_A] & !A_UIP | if updating { A_UIP } else { 0 }
            }
            REG_C => std::mem::take(&mut self.ram[REG_C]),
            _ => self.ram[index],
        }
    }

    fn hour(&self, hour: u8) -> u8 {
        if self.ram[REG_B] & B_24H != 0 {
            return self.encode(hour);
        }
        let pm = if hour >= 12 { 0x80 } else { 0 };
        let twelve = match hour % 12 {
            0 => 12,
            h => h,
        };
        self.encode(twelve) | pm
    }

    fn write_register(&mut self, index: usize, value: u8) {
        match index {
            REG_A => self.ram[REG_A] = value & !A_UIP,
            REG_B => {
                let was_setting = self.ram[REG_B] & B_SET != 0;
                if value & B_SET != 0 && !was_setting {
                    // Updates stop: the time registers hold the time now, for the guest to edit.
                    self.freeze();
                }
                self.ram[REG_B] = value;
                if was_setting && value & B_SET == 0 {
                    self.thaw();
                }
            }
            REG_C | REG_D => {}
            _ => self.ram[index] = value,
        }
    }

    /// Copies the running time into the time registers.
    fn freeze(&mut self) {
        let t = Civil::from_unix(self.now().0);
        self.ram[SECONDS] = self.encode(t.second);
        self.ram[MINUTES] = self.encode(t.minute);
        self.ram[HOURS] = self.hour(t.hour);
        self.ram[WEEKDAY] = self.encode(t.weekday);
        self.ram[DAY] = self.encode(t.day);
        self.ram[MONTH] = self.encode(t.month);
        self.ram[YEAR] = self.encode((t.year % 100) as u8);
        self.ram[CENTURY] = self.encode((t.year / 100) as u8);
    }

    /// Takes the time the guest wrote as the clock's new time.
    fn thaw(&mut self) {
        let hour = if self.ram[REG_B] & B_24H != 0 {
            self.decode(self.ram[HOURS])
        } else {
            let raw = self.ram[HOURS];
            self.decode(raw & 0x7f) % 12 + if raw & 0x80 != 0 { 12 } else { 0 }
        };
        let year = self.decode(self.ram[CENTURY]) as i64 * 100 + self.decode(self.ram[YEAR]) as i64;
        let t = Civil {
            year,
            month: self.decode(self.ram[MONTH]).clamp(1, 12),
            day: self.decode(self.ram[DAY]).clamp(1, 31),
            hour: hour.min(23),
            minute: self.decode(self.ram[MINUTES]).min(59),
            second: self.decode(self.ram[SECONDS]).min(59),
            weekday: 0,
        };
        let host = (self.clock)().as_secs() as i64;
        self.offset_s = t.to_unix() - host;
    }
}

impl BusDevice for CmosRtc {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        // The index port is write-only on the chip.
        if offset == 1
            && let Some(byte) = data.first_mut()
        {
            *byte = self.read_register(self.index);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else { return };
        match offset {
            0 => {
                self.nmi_masked = value & 0x80 != 0;
                self.index = (value & 0x7f) as usize;
            }
            _ => self.write_register(self.index, value),
        }
    }
}

/// A UTC date and time of day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
    /// 1 (Sunday) to 7, as the chip counts.
    weekday: u8,
}

impl Civil {
    /// From seconds since the UNIX epoch (the proleptic Gregorian calendar, days counted from
    /// 0000-03-01 so that leap days end each year).
    fn from_unix(secs: i64) -> Civil {
        let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Civil {
            year,
            month,
            day,
            hour: (rest / 3600) as u8,
            minute: (rest / 60 % 60) as u8,
            second: (rest % 60) as u8,
            // 1970-01-01 was a Thursday (5 when Sunday is 1).
            weekday: ((days + 4).rem_euclid(7) + 1) as u8,
        }
    }

    /// Seconds since the UNIX epoch.
    fn to_unix(self) -> i64 {
        let year = self.year - i64::from(self.month <= 2);
        let era = year.div_euclid(400);
        let yoe = year.rem_euclid(400);
        let month = self.month as i64;
        let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + self.day as i64 - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        days * 86_400 + self.hour as i64 * 3600 + self.minute as i64 * 60 + self.second as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// 2026-12-01 22:22:40 UTC, a Tuesday.
    const T: u64 = 1_796_163_760;

    fn rtc_at(nanos: Arc<AtomicU64>) -> CmosRtc {
        CmosRtc::new(Box::new(move || Duration::from_nanos(nanos.load(Ordering::SeqCst))))
    }

    fn read(rtc: &mut CmosRtc, index: u8) -> u8 {
        rtc.write(0, &[index]);
        let mut byte = [0];
        rtc.read(1, &mut byte);
        byte[0]
    }

    fn write(rtc: &mut CmosRtc, index: u8, value: u8) {
        rtc.write(0, &[index]);
        rtc.write(1, &[value]);
    }

    #[test]
    fn the_time_reads_in_bcd_24_hour_mode_as_firmware_leaves_it() {
        let now = Arc::new(AtomicU64::new(T * 1_000_000_000));
        let mut rtc = rtc_at(now);
        let regs: Vec<u8> = [0, 2, 4, 6, 7, 8, 9, 0x32].iter().map(|&i| read(&mut rtc, i)).collect();
        assert_eq!(regs, [0x40, 0x22, 0x22, 0x03, 0x01, 0x12, 0x26, 0x20]);
        assert_eq!(read(&mut rtc, 0x0d), 0x80, "valid RAM and time");
        write(&mut rtc, 0x0b, B_24H | B_BINARY);
        assert_eq!((read(&mut rtc, 0), read(&mut rtc, 4), read(&mut rtc, 9)), (40, 22, 26));
        write(&mut rtc, 0x0b, B_BINARY);
        assert_eq!(read(&mut rtc, 4), 0x80 | 10, "10 PM in 12-hour mode");
    }

    #[test]
    fn a_restored_rtc_keeps_the_guest_s_settings_and_offset_and_reads_the_host_s_now() {
        let now = Arc::new(AtomicU64::new(T * 1_000_000_000));
        let mut rtc = rtc_at(now.clone());
        write(&mut rtc, 0x0b, B_24H | B_BINARY);
        write(&mut rtc, 0x40, 0x5a);
        // The guest sets its clock an hour ahead of the host's.
        write(&mut rtc, 0x0b, B_24H | B_BINARY | B_SET);
        write(&mut rtc, 4, 23);
        write(&mut rtc, 0x0b, B_24H | B_BINARY);
        let saved: RtcState = serde_json::from_str(&serde_json::to_string(&rtc.state()).unwrap()).unwrap();
        // Restored ten minutes later.
        let later = Arc::new(AtomicU64::new((T + 600) * 1_000_000_000));
        let reading = later.clone();
        let mut restored =
            CmosRtc::from_state(&saved, Box::new(move || Duration::from_nanos(reading.load(Ordering::SeqCst))))
                .unwrap();
        assert_eq!(read(&mut restored, 0x40), 0x5a, "CMOS RAM");
        assert_eq!(
            (read(&mut restored, 4), read(&mut restored, 2)),
            (23, 32),
            "binary mode, an hour ahead, ten minutes on"
        );
        let short = RtcState { ram: vec![0; 12], ..saved };
        assert!(CmosRtc::from_state(&short, Box::new(|| Duration::ZERO)).is_err());
    }

    #[test]
    fn update_in_progress_shows_in_the_last_244_us_of_each_second() {
        let now = Arc::new(AtomicU64::new(T * 1_000_000_000 + 999_800_000));
        let mut rtc = rtc_at(now.clone());
        assert_eq!(read(&mut rtc, 0x0a), 0x26 | 0x80);
        now.store(T * 1_000_000_000 + 999_000_000, Ordering::SeqCst);
        assert_eq!(read(&mut rtc, 0x0a), 0x26);
        write(&mut rtc, 0x0a, 0xa6);
        assert_eq!(read(&mut rtc, 0x0a), 0x26, "UIP is read-only");
    }

    #[test]
    fn a_guest_that_sets_the_clock_moves_its_own_offset() {
        let now = Arc::new(AtomicU64::new(T * 1_000_000_000));
        let mut rtc = rtc_at(now.clone());
        write(&mut rtc, 0x0b, B_SET | B_24H);
        assert_eq!(read(&mut rtc, 0), 0x40, "the time stands while it is set");
        write(&mut rtc, 0x09, 0x30);
        write(&mut rtc, 0x04, 0x08);
        write(&mut rtc, 0x0b, B_24H);
        assert_eq!((read(&mut rtc, 9), read(&mut rtc, 4)), (0x30, 0x08));
        now.fetch_add(61 * 1_000_000_000, Ordering::SeqCst);
        assert_eq!((read(&mut rtc, 2), read(&mut rtc, 0)), (0x23, 0x41), "and runs on from there");
    }

    #[test]
    fn ram_nmi_mask_and_register_c() {
        let mut rtc = rtc_at(Arc::new(AtomicU64::new(0)));
        write(&mut rtc, 0x80 | 0x40, 0x5a);
        assert!(rtc.nmi_masked());
        assert_eq!(read(&mut rtc, 0x40), 0x5a);
        assert!(!rtc.nmi_masked());
        assert_eq!(read(&mut rtc, 0x0c), 0, "no interrupt flags");
        let mut byte = [0];
        rtc.read(0, &mut byte);
        assert_eq!(byte[0], 0xff, "the index port is write-only");
    }

    #[test]
    fn civil_dates_round_trip_over_leap_years_and_centuries() {
        for secs in [0i64, 951_782_400, 4_107_542_399, 1_796_163_760, -86_400, 253_402_300_799] {
            let civil = Civil::from_unix(secs);
            assert_eq!(civil.to_unix(), secs, "{civil:?}");
        }
        assert_eq!(Civil::from_unix(951_782_400).day, 29, "2000-02-29");
        assert_eq!(Civil::from_unix(0).weekday, 5, "a Thursday");
    }
}
