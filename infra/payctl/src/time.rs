//! Times in operator output.

/// An epoch-ms time as UTC, `2026-12-01T05:57:19.489Z`, for people reading operator output.
pub fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{ms} ms since 1970"))
}

/// A span of `ms` milliseconds in words: `45 s`, `12 min`, `3 h 5 min`, `4 d 2 h`.
pub fn in_words(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A point in time an operator gives (`--since`): an RFC 3339 time
/// (`2026-12-01T00:00:00Z`), unix seconds, or a span back from `now_s` (`90m`, `12h`, `3d`).
/// Unix seconds.
pub fn parse_point(text: &str, now_s: i64) -> Result<i64, String> {
    let t = text.trim();
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(t) {
        return Ok(at.timestamp());
    }
    if let Ok(s) = t.parse::<i64>() {
        return Ok(s);
    }
    let unit = t.chars().last().unwrap_or(' ');
    let scale = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => 0,
    };
    match t[..t.len().saturating_sub(1)].parse::<i64>() {
        Ok(n) if scale > 0 && n >= 0 => Ok(now_s - n * scale),
        _ => Err(format!(
            "{text:?} is not a time: give 2026-12-01T00:00:00Z, unix seconds, or a span back from now such as 90m, 12h, 3d"
        )),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn points_in_time_are_read_three_ways() {
        let now = 1_796_102_405;
        assert_eq!(
            super::parse_point("2026-12-01T00:00:00Z", now),
            Ok(1_796_083_200)
        );
        assert_eq!(super::parse_point("1796083200", now), Ok(1_796_083_200));
        assert_eq!(super::parse_point("3d", now), Ok(now - 3 * 86_400));
        assert_eq!(super::parse_point("90m", now), Ok(now - 5400));
        assert!(super::parse_point("yesterday", now).is_err());
        assert!(super::parse_point("-3d", now).is_err());
    }

    #[test]
    fn utc_reads_epoch_milliseconds() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::utc(1_796_102_405_123), "2026-12-01T05:20:05.123Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
