//! The admin server's request parsing: query values for `/logging`.

use super::*;

#[test]
fn query_values_are_found_and_percent_decoded() {
    let table = [
        ("level=debug", Ok(Some("debug"))),
        (
            "x=1&level=access%3Ddebug%2Cinfo",
            Ok(Some("access=debug,info")),
        ),
        ("level=a+b", Ok(Some("a b"))),
        ("other=1", Ok(None)),
        ("", Ok(None)),
        ("level=%zz", Err(AdminError::MalformedQuery)),
        ("level=%4", Err(AdminError::MalformedQuery)),
        ("level=%ff", Err(AdminError::MalformedQuery)),
    ];
    for (query, expected) in table {
        let expected = expected.map(|value| value.map(str::to_owned));
        assert_eq!(query_value(query, "level"), expected, "{query}");
    }
}
