// A model of a family's hit at 1,000,000 keys, without the family: how long one lookup takes when
// the record is reached through the index bucket's slot (a chain of two cache misses, as the family
// does it) and when the record sits at the bucket's own index (the two loads can overlap, as in a
// `Dictionary`'s key and value arrays). 16 shards of 62,500 keys, SipHash, 64-byte records; no lock
// or clock. Run:
//   swift run --package-path Benchmarks -c release IndexLayout
struct Record {
    var key: Int?
    var freshSince: Duration?
    var value: Int?
    var store: AnyObject?
}

@inline(never) func hashOf(_ key: Int) -> UInt64 {
    var hasher = Hasher()
    hasher.combine(key)
    return UInt64(bitPattern: Int64(hasher.finalize()))
}

/// The time of one lookup, each of the 1,000,000 keys looked up five times in a scattered order.
func lookup(atBucket: Bool) -> Duration {
    let perShard = 62_500
    let shards = 16
    let buckets = 1 << 17  // about half full, as the family's index
    var tables: [[UInt64]] = []
    var bySlot: [[Record]] = []
    var byBucket: [[Record]] = []
    for shard in 0..<shards {
        var table = [UInt64](repeating: 0, count: buckets)
        var records: [Record] = []
        var atBuckets = [Record](repeating: Record(), count: buckets)
        for index in 0..<perShard {
            let key = index * shards + shard
            let hash = hashOf(key)
            var bucket = Int((hash >> 32) & UInt64(buckets - 1))
            while table[bucket] != 0 { bucket = (bucket + 1) & (buckets - 1) }
            table[bucket] = (hash >> 32) << 32 | UInt64(records.count + 1)
            records.append(Record(key: key, freshSince: .zero, value: key))
            atBuckets[bucket] = Record(key: key, freshSince: .zero, value: key)
        }
        tables.append(table)
        bySlot.append(records)
        byBucket.append(atBuckets)
    }
    let total = perShard * shards
    var order: [Int] = []
    var key = 0
    for _ in 0..<total {
        key = (key &+ 7_919) % total
        order.append(key)
    }
    var found = 0
    let start = ContinuousClock.now
    for _ in 0..<5 {
        for key in order {
            let hash = hashOf(key)
            let shard = key % shards  // where it was put
            let tag = hash >> 32
            var bucket = Int(tag & UInt64(buckets - 1))
            tables[shard].withUnsafeBufferPointer { table in
                while table[bucket] != 0 {
                    let entry = table[bucket]
                    if entry >> 32 == tag {
                        let record =
                            atBucket
                            ? byBucket[shard].withUnsafeBufferPointer { $0[bucket] }
                            : bySlot[shard].withUnsafeBufferPointer { $0[Int(entry & 0xFFFF_FFFF) - 1] }
                        if record.key == key {
                            found &+= record.value! == key ? 1 : 0
                            return
                        }
                    }
                    bucket = (bucket + 1) & (buckets - 1)
                }
            }
        }
    }
    let elapsed = ContinuousClock.now - start
    precondition(found == 5 * total, "every key is found")
    return elapsed / (5 * total)
}

for round in 1...3 {
    print("round \(round): through the slot \(lookup(atBucket: false)), at the bucket \(lookup(atBucket: true))")
}
