use super::*;

#[test]
fn binary_and_decimal_are_kept_apart() {
    assert_eq!(parse_bytes("192MiB").unwrap(), Bytes(192.0 * 1048576.0));
    assert_eq!(parse_bytes("192MiB").unwrap(), Bytes(12288.0 * 4096.0 * 4.0));
    assert_eq!(parse_bytes("8KiB").unwrap(), Bytes(8192.0));
    assert_eq!(parse_bytes("8KB").unwrap(), Bytes(8000.0));
    assert_eq!(parse_bytes("1.125GiB").unwrap(), Bytes(1.125 * 1073741824.0));
    assert_eq!(parse_bytes("1e3B").unwrap(), Bytes(1000.0));
    assert_eq!(parse_rate("50GB/s").unwrap(), BytesPerSecond(5e10));
    assert_eq!(parse_rate("400Gbit/s").unwrap(), BytesPerSecond(5e10));
    assert_eq!(parse_rate("400Gbit/s").unwrap(), BytesPerSecond::gb_s(50.0));
}

#[test]
fn times_and_lengths() {
    let a = parse_seconds("0.833us").unwrap();
    let b = parse_seconds("0.833µs").unwrap();
    let c = parse_seconds("0.833μs").unwrap();
    assert_eq!(a, b);
    assert_eq!(a, c);
    assert!((a.0 - 0.833e-6).abs() < 1e-18);
    assert_eq!(parse_seconds("20ms").unwrap(), Seconds(0.02));
    assert_eq!(parse_seconds("8090h").unwrap(), Seconds(8090.0 * 3600.0));
    // "30m" is a length: metres, not minutes (cable length for §4.3).
    assert_eq!(parse_metres("30m").unwrap(), Metres(30.0));
    assert!(parse_seconds("30m").is_err());
}

#[test]
fn lists_and_repeats() {
    let l = parse_seconds_list("1us,2us").unwrap();
    assert_eq!(l.0, vec![Seconds::us(1.0), Seconds::us(2.0)]);
    let l = parse_seconds_list("0.4ms*98,2.4ms").unwrap();
    assert_eq!(l.0.len(), 99);
    assert!(matches!(parse_seconds_list("1us*0"), Err(UnitError::BadRepeat { .. })));
}

/// Regression (fuzz target `units`): a huge repeat count aborted the process trying to
/// allocate it; now it is a typed error, and the cap holds across items.
#[test]
fn huge_repeat_counts_are_errors_not_allocations() {
    assert!(matches!(parse_seconds_list("1ms*18446744073709551615"), Err(UnitError::TooMany { .. })));
    assert!(matches!(parse_bytes_list("1B*1048576,1B"), Err(UnitError::TooMany { .. })));
    assert_eq!(parse_rate_list("1GB/s*1048576").map(|l| l.0.len()), Ok(MAX_LIST_ITEMS));
    assert_eq!(parse_seconds_list("0.4ms*2,2.4ms").map(|l| l.0.len()), Ok(3));
}

#[test]
fn errors_say_what_to_write() {
    let e = parse_bytes("12furlongs").unwrap_err();
    assert!(matches!(e, UnitError::UnknownUnit { .. }));
    assert!(e.to_string().contains("unknown size unit 'furlongs'"), "{e}");
    let e = parse_bytes("-5MiB").unwrap_err();
    assert!(e.to_string().contains("cannot be negative"), "{e}");
    let e = parse_rate_pos("0GB/s").unwrap_err();
    assert!(e.to_string().contains("greater than zero"), "{e}");
    let e = parse_rate("400").unwrap_err();
    assert!(e.to_string().contains("no unit"), "{e}");
    assert!(parse_seconds("20").unwrap_err().to_string().contains("no unit"), "a bare time stays ambiguous (s? ms?)");
    let e = parse_rate("fastGB/s").unwrap_err();
    assert!(matches!(e, UnitError::BadNumber { .. }));
    assert!(matches!(parse_bytes(""), Err(UnitError::Empty { .. })));
}

#[test]
fn a_bare_number_is_a_size_in_bytes() {
    assert_eq!(parse_bytes("1500"), Ok(Bytes(1500.0)), "an MTU as people type it");
    assert_eq!(parse_bytes_pos(" 4096 "), Ok(Bytes(4096.0)));
    assert_eq!(parse_bytes("0"), Ok(Bytes(0.0)));
    assert_eq!(parse_bytes("1e3"), Ok(Bytes(1000.0)));
    assert_eq!(parse_bytes_list("1500,9000*2").map(|l| l.0), Ok(vec![Bytes(1500.0), Bytes(9000.0), Bytes(9000.0)]));
    // Still refused: garbage, a sign alone, negatives, zero where it must be positive.
    assert!(matches!(parse_bytes("abc"), Err(UnitError::BadNumber { .. })));
    assert!(matches!(parse_bytes("-"), Err(UnitError::BadNumber { .. })));
    assert!(matches!(parse_bytes("1500 furlongs"), Err(UnitError::UnknownUnit { .. })));
    assert!(matches!(parse_bytes("-1500"), Err(UnitError::Negative { .. })));
    assert!(matches!(parse_bytes_pos("0"), Err(UnitError::NotPositive { .. })));
    assert!(matches!(parse_bytes("1500.0.0"), Err(UnitError::BadNumber { .. })));
    assert!(matches!(parse_bytes("1e999"), Err(UnitError::NotFinite { .. })));
}

#[test]
fn arithmetic_is_typed() {
    let t = Bytes::mib(12.0) / BytesPerSecond::gb_s(50.0);
    assert!((t.in_us() - 251.658_24).abs() < 1e-6);
    let v = BytesPerSecond::gb_s(50.0) * Seconds::us(2.0);
    assert_eq!(v, Bytes(100_000.0));
    assert_eq!(Bytes::mib(360.0) / Bytes::mib(720.0), 0.5);
}

#[test]
fn rendering() {
    assert_eq!(Bytes::mib(192.0).to_string(), "192 MiB");
    assert_eq!(Bytes(250e6).dec().to_string(), "250 MB");
    assert_eq!(Seconds::ms(7.5752).to_string(), "7.575 ms");
    assert_eq!(BytesPerSecond::gb_s(16.384).to_string(), "16.38 GB/s");
    assert_eq!(sig(1.2996, 4), "1.3");
    assert_eq!(Bytes(999_999.999_999_9).dec().to_string(), "1 MB");
    assert_eq!(Bytes(1500.0).to_string(), "1500 B");
    assert_eq!(Bytes(4096.0).to_string(), "4 KiB");
    assert_eq!(Seconds(0.0).to_string(), "0 s");
}

/// Issue 33: `--bytes 1e30` printed "909494701772928256 TiB"; every quantity now has a range.
#[test]
fn quantities_out_of_range_are_errors() {
    assert!(matches!(parse_bytes("1e30"), Err(UnitError::TooLarge { .. })));
    let e = parse_bytes_pos("2048TiB").unwrap_err();
    assert!(e.to_string().contains("at most 1 PiB"), "{e}");
    assert_eq!(parse_bytes("1024TiB"), Ok(Bytes(GIB * 1024.0 * 1024.0)), "1 PiB itself is accepted");
    assert!(matches!(parse_rate_pos("2000TB/s"), Err(UnitError::TooLarge { .. })));
    assert!(parse_rate_pos("1600Gbit/s").is_ok());
    assert!(matches!(parse_rate_pos("1e-300B/s"), Err(UnitError::TooSmall { .. })));
    assert!(matches!(parse_seconds("1e-20s"), Err(UnitError::TooSmall { .. })));
    assert_eq!(parse_seconds("0s"), Ok(Seconds(0.0)), "zero stays allowed where the parser allows it");
    assert!(matches!(parse_seconds("1e12s"), Err(UnitError::TooLarge { .. })));
    assert!(matches!(parse_metres("1e9m"), Err(UnitError::TooLarge { .. })));
    assert!(parse_seconds("1ps").is_ok() && parse_bytes("1bit").is_ok());
}
