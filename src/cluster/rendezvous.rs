//! Which instance a partition belongs to: rendezvous (highest random weight) hashing over the
//! live members. For each partition every member gets a weight from a hash of (partition,
//! member name); ranked by weight, the first is the partition's owner and the next `standby`
//! wait behind it as single-active consumers, so that a crash is taken over at once.
//!
//! A member joining takes rank 1 only where its weight is the highest, and a member leaving
//! moves only the partitions it ranked first for to whoever ranked second: each change of the
//! members moves about P/N partitions, and only those. Every instance computes the same
//! ranking from the same names, without talking to the others; the hash is spelled out here
//! (not the standard library's, which may change between Rust versions) so that instances of
//! different builds agree.

/// The weight of `instance` for `partition`: FNV-1a over both, then a 64-bit finalizer so that
/// names differing in one character still spread evenly.
pub(crate) fn weight(partition: u16, instance: &str) -> u64 {
    weight_for(&partition.to_be_bytes(), instance)
}

/// The weight of `instance` for any `key` (a partition's is its two bytes, big-endian).
fn weight_for(key: &[u8], instance: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for byte in key.iter().chain([0xff].iter()).chain(instance.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(PRIME);
    }
    // splitmix64's finalizer.
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// `members` (distinct names) ranked for `partition`, first the owner (ties, which need equal
/// 64-bit weights, go by name).
pub(crate) fn ranking<S: AsRef<str>>(partition: u16, members: &[S]) -> Vec<&str> {
    leaders(partition, members, members.len())
}

/// The first `count` of `members` (distinct names) ranked for `partition`: its owner and
/// standbys. Only those are sorted, so that a thousand members cost one pass each.
pub(crate) fn leaders<S: AsRef<str>>(partition: u16, members: &[S], count: usize) -> Vec<&str> {
    let mut ranked: Vec<(u64, &str)> =
        members.iter().map(|m| (weight(partition, m.as_ref()), m.as_ref())).collect();
    let order = |a: &(u64, &str), b: &(u64, &str)| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1));
    let count = count.min(ranked.len());
    if count < ranked.len() && count > 0 {
        ranked.select_nth_unstable_by(count - 1, order);
    }
    ranked.truncate(count);
    ranked.sort_unstable_by(order);
    ranked.into_iter().map(|(_, name)| name).collect()
}

/// The member that holds the `[[streams]]` source `stream` among `members`: the one of highest
/// weight for the stream's name, as a partition's owner is.
pub(crate) fn stream_holder<'m, S: AsRef<str>>(stream: &str, members: &'m [S]) -> Option<&'m str> {
    let key = format!("stream/{stream}");
    members
        .iter()
        .map(|m| (weight_for(key.as_bytes(), m.as_ref()), m.as_ref()))
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))
        .map(|(_, name)| name)
}

/// The owner of `partition` among `members`.
pub fn owner<S: AsRef<str>>(partition: u16, members: &[S]) -> Option<&str> {
    ranking(partition, members).first().copied()
}

/// What `instance` consumes among `members`: the partitions it owns, and those it waits on as
/// one of the `standby` next in line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Share {
    pub owned: Vec<u16>,
    pub standby: Vec<u16>,
}

impl Share {
    /// Every partition of the share, in order.
    pub fn subscribed(&self) -> Vec<u16> {
        let mut all: Vec<u16> = self.owned.iter().chain(&self.standby).copied().collect();
        all.sort_unstable();
        all
    }
}

/// `instance`'s share of `partitions` among `members` with `standby` consumers behind each
/// owner.
pub fn share<S: AsRef<str>>(partitions: u16, members: &[S], standby: u16, instance: &str) -> Share {
    let mut share = Share::default();
    for partition in 0..partitions {
        match ranking(partition, members).iter().position(|m| *m == instance) {
            Some(0) => share.owned.push(partition),
            Some(rank) if rank <= usize::from(standby) => share.standby.push(partition),
            _ => {}
        }
    }
    share
}

/// How many of `partitions` change owner when the members go from `before` to `after`.
pub fn moved<S: AsRef<str>, T: AsRef<str>>(partitions: u16, before: &[S], after: &[T]) -> usize {
    (0..partitions).filter(|&p| owner(p, before) != owner(p, after)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("silpgate-{i}")).collect()
    }

    #[test]
    fn a_joining_member_takes_only_the_partitions_it_ranks_first_for() {
        let (three, four) = (names(3), names(4));
        for p in 0..128 {
            let (before, after) = (owner(p, &three).unwrap(), owner(p, &four).unwrap());
            assert!(before == after || after == "silpgate-3", "partition {p}: {before} -> {after}");
        }
        let moved = moved(128, &three, &four);
        // About a quarter, never all.
        assert!((16..=48).contains(&moved), "{moved} of 128 moved");
    }

    #[test]
    fn streams_spread_over_the_members_and_a_holder_leaving_moves_only_its_own() {
        let (three, four) = (names(3), names(4));
        let streams: Vec<String> = (0..64).map(|i| format!("feed-{i}")).collect();
        let held = |members: &[String]| -> Vec<String> {
            streams.iter().map(|s| stream_holder(s, members).unwrap().to_owned()).collect()
        };
        let (before, after) = (held(&four), held(&three));
        for member in &four {
            assert!(before.contains(member), "{member} holds no stream of 64");
        }
        for (b, a) in before.iter().zip(&after) {
            assert!(b == a || b == "silpgate-3", "a stream moved from {b} to {a}, though {b} stayed");
        }
        assert_eq!(stream_holder("feed", &Vec::<String>::new()), None);
    }

    #[test]
    fn a_leaving_members_partitions_go_to_their_second_ranked() {
        let four = names(4);
        let three: Vec<String> = four.iter().filter(|n| *n != "silpgate-1").cloned().collect();
        for p in 0..128 {
            let ranked = ranking(p, &four);
            let expected = if ranked[0] == "silpgate-1" { ranked[1] } else { ranked[0] };
            assert_eq!(owner(p, &three), Some(expected), "partition {p}");
        }
    }

    #[test]
    fn the_leaders_are_the_head_of_the_ranking() {
        let members = names(50);
        for p in 0..64 {
            let ranking = ranking(p, &members);
            for count in [0, 1, 2, 3, 50, 60] {
                assert_eq!(leaders(p, &members, count), ranking[..count.min(50)], "partition {p}, {count}");
            }
        }
    }

    #[test]
    fn shares_cover_every_partition_once_and_spread_evenly() {
        let members = names(10);
        let shares: Vec<Share> = members.iter().map(|m| share(1000, &members, 1, m)).collect();
        let owned: usize = shares.iter().map(|s| s.owned.len()).sum();
        let standby: usize = shares.iter().map(|s| s.standby.len()).sum();
        assert_eq!((owned, standby), (1000, 1000));
        for s in &shares {
            assert!((60..=140).contains(&s.owned.len()), "{s:?}");
        }
    }

    #[test]
    fn weights_are_stable_across_builds() {
        // Instances of different builds must rank alike: the hash is fixed. The values were
        // computed apart from this code, from the definition (FNV-1a 64 of the partition's two
        // bytes, 0xff and the name, then splitmix64's finalizer).
        assert_eq!(weight(7, "silpgate-0"), 0x6384_13b0_09d2_e903);
        assert_eq!(weight(0, "a"), 0x5c75_5cd6_1951_316a);
        assert_eq!(weight(1, "a"), 0x5f27_7dfa_6442_18f6);
        assert_eq!(weight(1023, "silpgate-b"), 0x688c_b60b_cac9_dbb2);
    }
}
