//! `strftime_now(format)` for templates: C `strftime` on a UTC time, the directives chat
//! templates use (dates in system prompts).

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
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Broken-down UTC time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tm {
    pub year: i64,
    pub month: u32, // 1..=12
    pub day: u32,   // 1..=31
    pub hour: u32,
    pub min: u32,
    pub sec: u32,
    pub weekday: u32, // 0 = Monday
    pub yday: u32,    // 1..=366
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

impl Tm {
    pub fn from_unix(t: i64) -> Tm {
        let days = t.div_euclid(86_400);
        let secs = t.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = CUM[month as usize - 1] + day + u32::from(month > 2 && is_leap(year));
        Tm {
            year,
            month,
            day,
            hour: secs / 3600,
            min: secs / 60 % 60,
            sec: secs % 60,
            weekday: (days + 3).rem_euclid(7) as u32, // 1970-01-01 was a Thursday
            yday,
        }
    }

    pub fn now() -> Tm {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Tm::from_unix(t)
    }
}

/// glibc-style `strftime`, including the `-` flag (no padding).
pub fn strftime(fmt: &str, tm: &Tm) -> String {
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let no_pad = spec == Some('-');
        if no_pad {
            spec = chars.next();
        }
        let num = |v: i64, width: usize| if no_pad { v.to_string() } else { format!("{v:0width$}") };
        let hour12 = if tm.hour.is_multiple_of(12) { 12 } else { tm.hour % 12 };
        match spec {
            Some('Y') => out.push_str(&tm.year.to_string()),
            Some('y') => out.push_str(&num(tm.year.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(tm.month.into(), 2)),
            Some('d') => out.push_str(&num(tm.day.into(), 2)),
            Some('e') => out.push_str(&if no_pad { tm.day.to_string() } else { format!("{:>2}", tm.day) }),
            Some('H') => out.push_str(&num(tm.hour.into(), 2)),
            Some('I') => out.push_str(&num(hour12.into(), 2)),
            Some('M') => out.push_str(&num(tm.min.into(), 2)),
            Some('S') => out.push_str(&num(tm.sec.into(), 2)),
            Some('j') => out.push_str(&num(tm.yday.into(), 3)),
            Some('p') => out.push_str(if tm.hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[tm.month as usize - 1]),
            Some('b') | Some('h') => out.push_str(&MONTHS[tm.month as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[tm.weekday as usize]),
            Some('a') => out.push_str(&DAYS[tm.weekday as usize][..3]),
            Some('u') => out.push_str(&(tm.weekday + 1).to_string()),
            Some('w') => out.push_str(&((tm.weekday + 1) % 7).to_string()),
            Some('F') => out.push_str(&format!("{}-{:02}-{:02}", tm.year, tm.month, tm.day)),
            Some('D') => {
                out.push_str(&format!("{:02}/{:02}/{:02}", tm.month, tm.day, tm.year.rem_euclid(100)))
            }
            Some('T') => out.push_str(&format!("{:02}:{:02}:{:02}", tm.hour, tm.min, tm.sec)),
            Some('R') => out.push_str(&format!("{:02}:{:02}", tm.hour, tm.min)),
            // A naive datetime has no zone: Python prints nothing for these.
            Some('z') | Some('Z') => {}
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        let tm = Tm::from_unix(1_741_964_966); // 2025-03-14 15:09:26, a Friday
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", &tm), "2025-03-14 15:09:26");
        assert_eq!(strftime("%d %b %Y", &tm), "14 Mar 2025");
        assert_eq!(
            strftime("%B %d, %Y %A %a %j %I%p %-m/%-d", &tm),
            "March 14, 2025 Friday Fri 073 03PM 3/14"
        );
        let tm = Tm::from_unix(951_782_400); // 2000-02-29
        assert_eq!(strftime("%F %j", &tm), "2000-02-29 060");
        let tm = Tm::from_unix(0);
        assert_eq!(strftime("%F %a", &tm), "1970-01-01 Thu");
    }
}
