//! `strftime_now(format)`: the date helper HF exposes to chat templates (Llama 3.x prints
//! "Today Date: 26 Jul 2024" with `strftime_now("%d %b %Y")`).
//!
//! Python formats `datetime.now()` in local time with the C library's `strftime`; this renders
//! UTC (servers run in UTC) in the C locale, for the directives glibc documents that templates
//! plausibly use. Unknown directives are copied through, as glibc does.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Monday
    weekday: u32,
    /// 1..=366
    yday: u32,
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl Civil {
    fn from_unix(secs: i64) -> Civil {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        // 1970-01-01 was a Thursday (3 with Monday = 0).
        let weekday = (days + 3).rem_euclid(7) as u32;
        const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let leap_day = u32::from(month > 2 && is_leap(year));
        let yday = CUMULATIVE[(month - 1) as usize] + day + leap_day;
        Civil {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            weekday,
            yday,
        }
    }
}

/// Formats `secs` (Unix time, UTC) with a C-locale `strftime` format.
pub(crate) fn strftime_unix(format: &str, secs: i64) -> String {
    let t = Civil::from_unix(secs);
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // glibc's `%-d` flag: no padding.
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let num = |out: &mut String, n: i64, width: usize| {
            let _ = if unpadded {
                write!(out, "{n}")
            } else {
                write!(out, "{n:0width$}")
            };
        };
        let hour12 = if t.hour.is_multiple_of(12) {
            12
        } else {
            t.hour % 12
        };
        match d {
            'Y' => {
                let _ = write!(out, "{}", t.year);
            }
            'y' => num(&mut out, t.year.rem_euclid(100), 2),
            'm' => num(&mut out, t.month.into(), 2),
            'd' => num(&mut out, t.day.into(), 2),
            'e' => {
                let _ = write!(out, "{:2}", t.day);
            }
            'H' => num(&mut out, t.hour.into(), 2),
            'I' => num(&mut out, hour12.into(), 2),
            'M' => num(&mut out, t.minute.into(), 2),
            'S' => num(&mut out, t.second.into(), 2),
            'j' => num(&mut out, t.yday.into(), 3),
            'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            'a' => out.push_str(&WEEKDAYS[t.weekday as usize][..3]),
            'A' => out.push_str(WEEKDAYS[t.weekday as usize]),
            'b' | 'h' => out.push_str(&MONTHS[(t.month - 1) as usize][..3]),
            'B' => out.push_str(MONTHS[(t.month - 1) as usize]),
            'u' => {
                let _ = write!(out, "{}", t.weekday + 1);
            }
            'w' => {
                let _ = write!(out, "{}", (t.weekday + 1) % 7);
            }
            'F' => {
                let _ = write!(out, "{}-{:02}-{:02}", t.year, t.month, t.day);
            }
            'D' => {
                let _ = write!(
                    out,
                    "{:02}/{:02}/{:02}",
                    t.month,
                    t.day,
                    t.year.rem_euclid(100)
                );
            }
            'T' => {
                let _ = write!(out, "{:02}:{:02}:{:02}", t.hour, t.minute, t.second);
            }
            'R' => {
                let _ = write!(out, "{:02}:{:02}", t.hour, t.minute);
            }
            // A naive `datetime.now()` has no zone: Python prints nothing for these.
            'Z' | 'z' => {}
            'n' => out.push('\n'),
            't' => out.push('\t'),
            '%' => out.push('%'),
            other => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
        }
    }
    out
}

/// Seconds since the Unix epoch of `time` (negative before 1970).
pub(crate) fn unix_secs(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_python_in_utc() {
        // 2024-07-26 13:45:09 UTC, a Friday; expectations printed by Python's strftime.
        let t = 1_722_001_509;
        assert_eq!(strftime_unix("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime_unix("%A %B %-d %H:%M:%S %I%p %j %y %F %%", t),
            "Friday July 26 13:45:09 01PM 208 24 2024-07-26 %"
        );
        assert_eq!(strftime_unix("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime_unix("%a %j", 951_782_400), "Tue 060"); // 2000-02-29
        assert_eq!(strftime_unix("%Q", 0), "%Q");
    }
}
