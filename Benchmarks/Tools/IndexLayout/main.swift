// A model of a family's hit at 1,000,000 keys, without the family: how long one lookup takes when
// the record is reached
// - through the index bucket's slot (a chain of two cache misses: the family until 2026-11-23);
// - at the bucket's own index (the two loads can overlap, as in a `Dictionary`'s key and value
//   arrays);
// - near its key's home (as the family now does: each record at the first free position from its
//   home in a table sized like the index, the four positions from the home tried before the index,
//   so that most lookups read the record alone).
// 16 shards of 62,500 keys, SipHash, 56-byte records (the family's with `Int` keys and values); no
// lock or clock. Run:
//   swift run --package-path Benchmarks -c release IndexLayout
struct Record {
    var freshSince: Duration = .zero
    var store: AnyObject?
    var key: Int?
    var slot: Int32 = 0
    var value: Int?
}

@inline(never) func hashOf(_ key: Int) -> UInt64 {
    var hasher = Hasher()
    hasher.combine(key)
    return UInt64(bitPattern: Int64(hasher.finalize()))
}

enum Layout: CaseIterable {
    case throughTheSlot, atTheBucket, nearItsHome
}

/// The time of one lookup, each of the 1,000,000 keys looked up five times in a scattered order.
func lookup(_ layout: Layout) -> Duration {
    let perShard = 62_500
    let shards = 16
    let buckets = 1 << 17  // about half full, as the family's index
    let mask = buckets - 1
    var tables: [[UInt64]] = []
    var recordTables: [[Record]] = []
    for shard in 0..<shards {
        var table = [UInt64](repeating: 0, count: buckets)
        var records = layout == .throughTheSlot ? [] : [Record](repeating: Record(), count: buckets)
        for index in 0..<perShard {
            let key = index * shards + shard
            let tag = hashOf(key) >> 32
            var bucket = Int(tag) & mask
            while table[bucket] != 0 { bucket = (bucket + 1) & mask }
            let position: Int
            switch layout {
            case .throughTheSlot:
                position = records.count
                records.append(Record(key: key, value: key))
            case .atTheBucket:
                position = bucket
                records[position] = Record(key: key, value: key)
            case .nearItsHome:
                var free = Int(tag) & mask
                while records[free].key != nil { free = (free + 1) & mask }
                position = free
                records[position] = Record(key: key, value: key)
            }
            table[bucket] = tag << 32 | UInt64(position + 1)
        }
        tables.append(table)
        recordTables.append(records)
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
            let shard = key % shards  // where it was put
            let tag = hashOf(key) >> 32
            recordTables[shard].withUnsafeBufferPointer { records in
                if layout == .nearItsHome {
                    var position = Int(tag) & mask
                    for _ in 0..<4 {
                        if records[position].key == key {
                            found &+= records[position].value! == key ? 1 : 0
                            return
                        }
                        position = (position + 1) & mask
                    }
                }
                tables[shard].withUnsafeBufferPointer { table in
                    var bucket = Int(tag) & mask
                    while table[bucket] != 0 {
                        let entry = table[bucket]
                        if entry >> 32 == tag {
                            let record =
                                layout == .atTheBucket ? records[bucket] : records[Int(entry & 0xFFFF_FFFF) - 1]
                            if record.key == key {
                                found &+= record.value! == key ? 1 : 0
                                return
                            }
                        }
                        bucket = (bucket + 1) & mask
                    }
                }
            }
        }
    }
    let elapsed = ContinuousClock.now - start
    precondition(found == 5 * total, "every key is found")
    return elapsed / (5 * total)
}

for round in 1...3 {
    print(
        "round \(round): through the slot \(lookup(.throughTheSlot)), at the bucket \(lookup(.atTheBucket)),"
            + " near its home \(lookup(.nearItsHome))")
}
