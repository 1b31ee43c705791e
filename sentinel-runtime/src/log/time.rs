//! Calendar formatting of epoch milliseconds (UTC), without a date library.

/// (year, month, day) of the day `days` after 1970-01-01 (the proleptic Gregorian calendar).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift the epoch to 0000-03-01 so that leap days end a year; eras are 400 years (146097 days).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `yyyy-MM-dd` of an epoch time in ms.
pub(crate) fn format_date(ms: u64) -> String {
    let (y, m, d) = civil_from_days((ms / 86_400_000) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `yyyy-MM-dd HH:mm:ss` of an epoch time in ms.
pub(crate) fn format_date_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (h, mi, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    format!("{} {h:02}:{mi:02}:{s:02}", format_date(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_dates() {
        assert_eq!(format_date_time(0), "1970-01-01 00:00:00");
        assert_eq!(format_date_time(1_700_000_000_000), "2023-11-14 22:13:20");
        assert_eq!(format_date_time(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(format_date_time(4_107_542_399_000), "2100-02-28 23:59:59");
        assert_eq!(format_date(1_709_164_800_000), "2024-02-29");
    }
}
