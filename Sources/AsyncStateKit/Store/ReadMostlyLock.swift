public import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A value that a ``ReadMostlyLock`` guards: what each of the lock's stripes keeps for the readers
/// that hold it, and how a writer folds that into the value.
@usableFromInline
protocol StripeReadable {
    /// What a reader holding one stripe may write (a buffer of the accesses it saw, say): never the
    /// value itself, which readers on other stripes read at the same time.
    associatedtype StripeLocal: StripeLocalStorage
    /// Folds what readers left in `local` into the value, and empties it: called by every writer,
    /// for every stripe, before it changes or reads the value, and when a reader's stripe is full.
    ///
    /// It must change only what readers never read: when a stripe is full it runs under the mutex and
    /// that stripe alone, while readers hold the others.
    mutating func absorb(_ local: inout StripeLocal)
}

/// What a stripe of a ``ReadMostlyLock`` keeps for its readers.
@usableFromInline
protocol StripeLocalStorage {
    init()
    /// Whether a reader should have a writer fold this in soon (a buffer that is full).
    var wantsAbsorbing: Bool { get }
}

/// A stripe that keeps nothing for its readers.
@usableFromInline
struct NoStripeLocal: StripeLocalStorage {
    @inlinable init() {}
    @inlinable var wantsAbsorbing: Bool { false }
}

/// A lock for a value that many threads read at once and few write: a state's published snapshot, a
/// family's shard.
///
/// It starts as one pthread mutex, as ``LockedValue`` is, and readers and writers alike take it: an
/// uncontended read costs one lock and unlock. When readers find it taken often (``spreadAfter``
/// times), it spreads: it allocates a stripe per processor (a mutex of its own and the
/// ``StripeReadable/StripeLocal`` that readers on it may write, each on its own cache lines), and from
/// then on a reader takes only the stripe of the processor it runs on. Readers on different
/// processors then write no memory in common, so their reads scale with the cores; only a read of a
/// value that holds references still retains that value's storage, which no Swift read avoids. A
/// writer takes the mutex and then every stripe, in order, so it excludes every reader, and before
/// it runs it folds every stripe's local storage into the value (``StripeReadable/absorb(_:)``). A
/// stripe whose local storage is full is folded in by the reader that filled it, under the mutex
/// and one stripe at a time.
/// The stripes are kept until the lock is freed: a lock never shrinks back.
///
/// ThreadSanitizer sees every synchronization: readers and writers meet only on pthread mutexes
/// (which it intercepts), and the stripes are published once, with a release store of an atomic that
/// readers load with acquire ordering (which it models), after being initialized under the mutex.
@usableFromInline
struct ReadMostlyLock<Value: StripeReadable>: @unchecked Sendable {
    // @unchecked Sendable is sound: the value is written only by a writer, which holds the mutex and
    // every stripe (so no reader holds any), and read only by a reader holding the mutex (before the
    // lock spreads: then it excludes every writer) or one stripe (after: every writer needs it too). A
    // stripe's local storage is touched only by the holder of that stripe or by a writer holding all.
    @usableFromInline let storage: ReadMostlyStorage<Value>

    /// How many times readers find the mutex taken before the lock spreads.
    @inlinable static var spreadAfter: Int { 16 }

    /// Creates a lock guarding `initialValue`, one mutex until readers contend.
    @usableFromInline init(_ initialValue: Value) {
        storage = ReadMostlyStorage.make(initialValue)
    }

    /// Whether readers have contended enough for the lock to spread (for tests).
    @usableFromInline var isSpread: Bool {
        storage.withUnsafeMutablePointerToElements { $0[0].load(ordering: .acquiring) != 0 }
    }

    /// How many reads have found the mutex taken so far (for tests).
    var contendedReads: Int {
        storage.withUnsafeMutablePointerToElements { $0[1].load(ordering: .relaxed) }
    }

    /// Spreads the lock now, as contention would (for tests, which cannot count on contention).
    func spreadNow() {
        storage.withUnsafeMutablePointerToElements { words in
            let mutex = ReadMostlyStorage<Value>.mutex(in: words)
            MutexWords.lock(mutex)
            if words[0].load(ordering: .relaxed) == 0 { _ = Self.spread(words) }
            MutexWords.unlock(mutex)
        }
    }

    /// Runs `body` with exclusive access to the value, after folding every stripe's local storage
    /// into it: every change, and every read that must see what the readers left.
    ///
    /// Never call back into the same lock from `body`, and never resume a continuation inside it.
    @inlinable
    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        try storage.withUnsafeMutablePointers { value, words in
            let mutex = ReadMostlyStorage<Value>.mutex(in: words)
            MutexWords.lock(mutex)
            defer { MutexWords.unlock(mutex) }
            // The stripes are published under the mutex, so a relaxed load sees them.
            let address = words[0].load(ordering: .relaxed)
            guard address != 0 else { return try body(&value.pointee) }
            let stripes = Stripes<Value.StripeLocal>(address)
            stripes.lockAll()
            defer { stripes.unlockAll() }
            stripes.absorbAll(into: &value.pointee)
            return try body(&value.pointee)
        }
    }

    /// `read` of the value, which it must not change, under whichever lock readers take now.
    @inlinable @inline(__always)
    func read<Result>(_ read: (UnsafePointer<Value>) -> Result) -> Result {
        access(exclusive: { read($0) }, shared: { value, _ in read(value) })
    }

    /// A read that may leave something for writers: `exclusive` with the value, which it may change,
    /// while readers take the mutex; `shared` with the value, which it must not change, and the
    /// caller's stripe's local storage, which it may, once the lock has spread.
    ///
    /// The closures get a pointer to the value, not the value itself: `inout` would be a write in
    /// ThreadSanitizer's eyes (it reports concurrent `inout` accesses as races, whatever they do),
    /// and a copy of a value with references would retain them, writes that every reader would
    /// share. Read the fields needed through the pointer (`$0.pointee.field`): a whole value passed on
    /// from `pointee` may be copied.
    ///
    /// Always inlined with its closures; what it calls out of line takes none (a closure passed to a
    /// call that is not inlined is formed on every read, and a key path given as the closure is
    /// instantiated, at a cost of microseconds).
    @inlinable @inline(__always)
    func access<Result>(
        exclusive: (UnsafeMutablePointer<Value>) -> Result,
        shared: (UnsafePointer<Value>, inout Value.StripeLocal) -> Result
    ) -> Result {
        storage.withUnsafeMutablePointers { value, words in
            var address = words[0].load(ordering: .acquiring)
            if address == 0 {
                let mutex = ReadMostlyStorage<Value>.mutex(in: words)
                if !MutexWords.tryLock(mutex) {
                    address = Self.enterContended(words)
                } else if words[0].load(ordering: .relaxed) != 0 {
                    // Spread between the load and the lock (the stripes are published under the mutex).
                    MutexWords.unlock(mutex)
                    address = words[0].load(ordering: .acquiring)
                }
                if address == 0 {
                    defer { MutexWords.unlock(mutex) }
                    return exclusive(value)
                }
            }
            let stripes = Stripes<Value.StripeLocal>(address)
            let index = stripes.current
            let stripe = stripes.mutex(index)
            MutexWords.lock(stripe)
            let local = stripes.local(index)
            let result = shared(value, &local.pointee)
            let wantsAbsorbing = local.pointee.wantsAbsorbing
            MutexWords.unlock(stripe)
            if wantsAbsorbing { Self.absorbIfFree(value, words, stripes) }
            return result
        }
    }

    /// For a read that found the mutex taken: counts it, takes the mutex, and spreads the lock at the
    /// ``spreadAfter``th. Returns 0 holding the mutex (the lock has not spread: read under it), or
    /// the stripes' address not holding it.
    @inlinable @inline(never)
    static func enterContended(_ words: UnsafeMutablePointer<Atomic<Int>>) -> Int {
        let contended = words[1].add(1, ordering: .relaxed).newValue
        let mutex = ReadMostlyStorage<Value>.mutex(in: words)
        MutexWords.lock(mutex)
        var address = words[0].load(ordering: .relaxed)
        if address == 0, contended >= spreadAfter { address = spread(words) }
        if address != 0 { MutexWords.unlock(mutex) }
        return address
    }

    /// Makes the stripes and publishes their address, which it returns: the lock spreads (under the
    /// mutex, which the caller holds, and only once).
    @inlinable
    static func spread(_ words: UnsafeMutablePointer<Atomic<Int>>) -> Int {
        let address = Int(bitPattern: Stripes<Value.StripeLocal>.make().base)
        // Released, so that a reader that loads the address (acquiring) sees the stripes made.
        words[0].store(address, ordering: .releasing)
        return address
    }

    /// Folds every stripe into the value if the mutex is free now (otherwise a writer is at work, and
    /// will): holding the mutex, which excludes writers, and one stripe at a time, so that readers on
    /// the other stripes go on reading (see ``StripeReadable/absorb(_:)``).
    @inlinable @inline(never)
    static func absorbIfFree(
        _ value: UnsafeMutablePointer<Value>, _ words: UnsafeMutablePointer<Atomic<Int>>,
        _ stripes: Stripes<Value.StripeLocal>
    ) {
        let mutex = ReadMostlyStorage<Value>.mutex(in: words)
        guard MutexWords.tryLock(mutex) else { return }
        for index in 0..<stripes.count {
            MutexWords.lock(stripes.mutex(index))
            value.pointee.absorb(&stripes.local(index).pointee)
            MutexWords.unlock(stripes.mutex(index))
        }
        MutexWords.unlock(mutex)
    }
}

/// The allocation behind a ``ReadMostlyLock``: the value as the header; as the elements, two
/// atomic words (the stripes' address once the lock has spread, else 0; how many reads found the
/// mutex taken), then the mutex (raw words, as ``LockStorage``'s).
@usableFromInline
final class ReadMostlyStorage<Value: StripeReadable>: ManagedBuffer<Value, Atomic<Int>> {
    static func make(_ value: Value) -> ReadMostlyStorage<Value> {
        let mutexWords = (MemoryLayout<pthread_mutex_t>.size + 7) / 8
        let buffer = create(minimumCapacity: 2 + mutexWords) { _ in value }
        let storage = buffer as! ReadMostlyStorage<Value>  // as LockStorage does
        storage.withUnsafeMutablePointerToElements { words in
            (words + 0).initialize(to: Atomic(0))
            (words + 1).initialize(to: Atomic(0))
            MutexWords.initialize(Self.mutex(in: words))
        }
        return storage
    }

    /// The mutex, after the two atomic words.
    @inlinable static func mutex(in words: UnsafeMutablePointer<Atomic<Int>>) -> UnsafeMutablePointer<UInt64> {
        UnsafeMutableRawPointer(words + 2).assumingMemoryBound(to: UInt64.self)
    }

    deinit {
        withUnsafeMutablePointerToElements { words in
            let stripes = words[0].load(ordering: .acquiring)
            if stripes != 0 { Stripes<Value.StripeLocal>(stripes).deallocate() }
            MutexWords.destroy(Self.mutex(in: words))
            (words + 0).deinitialize(count: 2)
        }
    }
}

/// The stripes of a ``ReadMostlyLock`` that has spread: one allocation, aligned to a cache line
/// pair, a header line (the stripe count and how to find the caller's processor) and then a stripe
/// per processor (its mutex, then its local storage), each starting on a line pair of its own so that
/// no two stripes share a cache line (nor a pair that the processor fetches together).
@usableFromInline
struct Stripes<Local: StripeLocalStorage> {
    @usableFromInline let base: UnsafeMutableRawPointer

    @inlinable init(_ base: UnsafeMutableRawPointer) { self.base = base }

    /// The stripes at `address` (not 0).
    @inlinable init(_ address: Int) { base = UnsafeMutableRawPointer(bitPattern: address).unsafelyUnwrapped }

    /// The alignment of the allocation and of each stripe.
    @inlinable static var line: Int { 128 }
    /// Where a stripe's local storage starts, from the stripe's start.
    @inlinable static var localOffset: Int {
        let alignment = MemoryLayout<Local>.alignment
        return (ProcessorStripes.mutexBytes + alignment - 1) / alignment * alignment
    }
    /// The distance between stripes.
    @inlinable static var stride: Int { (localOffset + MemoryLayout<Local>.size + line - 1) / line * line }

    /// The number of stripes (a power of two).
    @inlinable var count: Int { base.load(as: Int.self) }

    /// The stripe of the processor the caller runs on now (it may move at once: that costs
    /// contention, never correctness).
    @inlinable var current: Int {
        let processor = base.load(fromByteOffset: MemoryLayout<Int>.stride, as: ProcessorStripes.Reader.self)()
        return Int(truncatingIfNeeded: processor) & (count - 1)
    }

    /// The mutex of stripe `index`.
    @inlinable func mutex(_ index: Int) -> UnsafeMutablePointer<UInt64> {
        (base + Self.line + index * Self.stride).assumingMemoryBound(to: UInt64.self)
    }

    /// The local storage of stripe `index`.
    @inlinable func local(_ index: Int) -> UnsafeMutablePointer<Local> {
        (base + Self.line + index * Self.stride + Self.localOffset).assumingMemoryBound(to: Local.self)
    }

    /// Takes every stripe, in order (a writer's half of the lock, after the mutex).
    @inlinable func lockAll() {
        for index in 0..<count { MutexWords.lock(mutex(index)) }
    }

    /// Releases every stripe, in the reverse order.
    @inlinable func unlockAll() {
        for index in (0..<count).reversed() { MutexWords.unlock(mutex(index)) }
    }

    /// Folds every stripe's local storage into `value` (the caller holds every stripe).
    @inlinable func absorbAll<Value: StripeReadable>(into value: inout Value) where Value.StripeLocal == Local {
        for index in 0..<count { value.absorb(&local(index).pointee) }
    }

    /// Allocates and initializes the stripes, a stripe per processor.
    @usableFromInline static func make() -> Stripes {
        let count = ProcessorStripes.count
        let base = UnsafeMutableRawPointer.allocate(byteCount: line + count * stride, alignment: line)
        base.storeBytes(of: count, as: Int.self)
        base.storeBytes(
            of: ProcessorStripes.reader, toByteOffset: MemoryLayout<Int>.stride, as: ProcessorStripes.Reader.self)
        let stripes = Stripes(base)
        for index in 0..<count {
            MutexWords.initialize(stripes.mutex(index))
            stripes.local(index).initialize(to: Local())
        }
        return stripes
    }

    /// Destroys the stripes and frees them (when the lock is freed).
    @usableFromInline func deallocate() {
        for index in 0..<count {
            MutexWords.destroy(mutex(index))
            _ = local(index).deinitialize(count: 1)
        }
        base.deallocate()
    }
}

/// How many stripes a lock that spreads gets, and how a reader finds its own.
@usableFromInline
enum ProcessorStripes {
    /// Reads the processor the caller runs on.
    @usableFromInline typealias Reader = @convention(c) () -> Int32

    /// The bytes of a mutex, rounded up to words.
    @usableFromInline static let mutexBytes = (MemoryLayout<pthread_mutex_t>.size + 7) / 8 * 8

    /// A stripe per processor this process may run on, rounded up to a power of two, at least 2 and
    /// at most 64 (more stripes than that cost writers more than they save readers).
    static let count: Int = {
        let processors = max(2, min(64, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))))
        var count = 1
        while count < processors { count <<= 1 }
        return count
    }()

    /// `sched_getcpu`, which Linux answers from memory the kernel keeps per thread (a few
    /// nanoseconds); elsewhere, a hash of the thread's identity, which spreads threads across stripes
    /// as well, only not by processor.
    static let reader: Reader = {
        #if os(Linux)
        if let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "sched_getcpu") {
            return unsafeBitCast(symbol, to: Reader.self)
        }
        #endif
        #if os(Linux)
        return { Int32(truncatingIfNeeded: pthread_self() >> 12) }
        #else
        return { Int32(truncatingIfNeeded: Int(bitPattern: pthread_self()) >> 12) }
        #endif
    }()
}
