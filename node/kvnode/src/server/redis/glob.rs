//! Redis's glob matcher (`stringmatchlen` in Redis's `util.c`), ported
//! byte for byte so `KEYS`, `SCAN ... MATCH` and `HSCAN ... MATCH` select
//! exactly what Redis selects: `*`, `?`, `[abc]`, `[^abc]`, `[a-z]` (ends
//! in either order), `\x` escapes, an unclosed `[` matching to the end of
//! the pattern, and bytes compared as C's signed `char` in ranges.

/// Nested `*` the matcher follows at most before it answers "no match"
/// (Redis 7.2's own bound): each `*` is one level of recursion, and a
/// pattern comes from the network.
pub const GLOB_NESTING_MAX: usize = 1000;

/// Whether `string` matches `pattern` (case-sensitive, as Redis's key
/// matching is). As Redis's, a lone `*` does not match the empty string:
/// callers that list keys treat a lone `*` as "everything" without
/// matching, as Redis does.
pub fn matches(pattern: &[u8], string: &[u8]) -> bool {
    let mut skip_longer = false;
    match_impl(pattern, string, &mut skip_longer, 0)
}

/// A byte as C's signed `char` compares it.
fn signed(byte: u8) -> i32 {
    i32::from(byte as i8)
}

fn match_impl(pattern: &[u8], string: &[u8], skip_longer: &mut bool, nesting: usize) -> bool {
    if nesting > GLOB_NESTING_MAX {
        return false;
    }
    // Reads past the end see C's terminating NUL.
    let at = |slice: &[u8], i: usize| slice.get(i).copied().unwrap_or(0);
    let (mut p, mut s) = (0usize, 0usize);
    while p < pattern.len() && s < string.len() {
        match pattern[p] {
            b'*' => {
                while p + 1 < pattern.len() && pattern[p + 1] == b'*' {
                    p += 1;
                }
                if p + 1 == pattern.len() {
                    return true;
                }
                while s < string.len() {
                    if match_impl(&pattern[p + 1..], &string[s..], skip_longer, nesting + 1) {
                        return true;
                    }
                    if *skip_longer {
                        return false;
                    }
                    s += 1;
                }
                // No match of the rest from anywhere in the rest of the
                // string: a longer match of an earlier `*` cannot help.
                *skip_longer = true;
                return false;
            }
            b'?' => {
                s += 1;
            }
            b'[' => {
                p += 1;
                let negate = at(pattern, p) == b'^';
                if negate {
                    p += 1;
                }
                let mut matched = false;
                let c = string[s];
                loop {
                    if at(pattern, p) == b'\\' && pattern.len() - p >= 2 {
                        p += 1;
                        if pattern[p] == c {
                            matched = true;
                        }
                    } else if at(pattern, p) == b']' && p < pattern.len() {
                        break;
                    } else if p >= pattern.len() {
                        // An unclosed class: step back so the outer
                        // advance lands on the end.
                        p -= 1;
                        break;
                    } else if pattern.len() - p >= 3 && pattern[p + 1] == b'-' {
                        let (mut start, mut end) = (signed(pattern[p]), signed(pattern[p + 2]));
                        if start > end {
                            std::mem::swap(&mut start, &mut end);
                        }
                        p += 2;
                        let c = signed(c);
                        if c >= start && c <= end {
                            matched = true;
                        }
                    } else if pattern[p] == c {
                        matched = true;
                    }
                    p += 1;
                }
                if negate {
                    matched = !matched;
                }
                if !matched {
                    return false;
                }
                s += 1;
            }
            b'\\' => {
                if pattern.len() - p >= 2 {
                    p += 1;
                }
                if pattern[p] != string[s] {
                    return false;
                }
                s += 1;
            }
            other => {
                if other != string[s] {
                    return false;
                }
                s += 1;
            }
        }
        p += 1;
        if s == string.len() {
            while at(pattern, p) == b'*' && p < pattern.len() {
                p += 1;
            }
            break;
        }
    }
    p >= pattern.len() && s == string.len()
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs_match_as_redis_does() {
        let cases: &[(&str, &str, bool)] = &[
            // The matcher itself: a lone `*` needs one byte (KEYS and SCAN
            // skip matching for a lone `*`, as Redis does).
            ("*", "", false),
            ("*", "anything", true),
            ("", "", true),
            ("", "a", false),
            ("a", "", false),
            ("h?llo", "hello", true),
            ("h?llo", "hllo", false),
            ("h*llo", "hllo", true),
            ("h*llo", "heeeello", true),
            ("h[ae]llo", "hallo", true),
            ("h[ae]llo", "hillo", false),
            ("h[^e]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hbllo", true),
            ("h[b-a]llo", "hallo", true),
            ("h[a-b]llo", "hcllo", false),
            ("h\\*llo", "h*llo", true),
            ("h\\*llo", "hello", false),
            ("user:*", "user:1", true),
            ("user:*", "user", false),
            ("*:1", "user:1", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("a**", "a", true),
            ("[abc", "a", true),
            ("[abc", "d", false),
            ("ab[", "abc", false),
            ("a\\", "a\\", true),
            ("[\\]]", "]", true),
            ("*a", "ba", true),
            ("?", "", false),
        ];
        for (pattern, string, expected) in cases {
            assert_eq!(
                matches(pattern.as_bytes(), string.as_bytes()),
                *expected,
                "{pattern:?} on {string:?}"
            );
        }
    }

    #[test]
    fn many_stars_end_quickly() {
        let pattern = "a*".repeat(5000) + "b";
        let string = "a".repeat(4000);
        assert!(!matches(pattern.as_bytes(), string.as_bytes()));
    }
}
