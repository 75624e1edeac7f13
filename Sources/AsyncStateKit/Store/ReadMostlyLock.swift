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
    /// Folds what readers left in `local` into the value at `value`, and empties it: called by every
    /// writer, for every stripe, before it changes or reads the value, and by a reader whose stripe
    /// wants absorbing (``StripeLocalStorage/wantsAbsorbing``) under the mutex and its own stripe.
    ///
    /// So it may run while readers on the other stripes read the value: it must change only fields
    /// that readers never read, each through the pointer (`value.pointee.field.change()`), never
    /// `value.pointee` as a whole (an access to the whole value, which ThreadSanitizer would see
    /// overlap the readers' and report).
    static func absorb(_ local: inout StripeLocal, into value: UnsafeMutablePointer<Self>)
}

/// What a stripe of a ``ReadMostlyLock`` keeps for its readers.
@usableFromInline
protocol StripeLocalStorage {
    /// The storage of stripe `stripe` (0 to the stripe count less one), empty.
    init(stripe: Int)
    /// Whether the reader that holds the stripe should fold it into the value now if the mutex is
    /// free (a buffer filling up); if it is taken, the reader goes on.
    var wantsAbsorbing: Bool { get }
    /// Whether the next reader of the stripe must fold it in before it reads, waiting for the mutex
    /// if need be (a buffer that is full and whose contents may not be dropped).
    var mustAbsorb: Bool { get }
}

/// A stripe that keeps nothing for its readers.
@usableFromInline
struct NoStripeLocal: StripeLocalStorage {
    @inlinable init(stripe: Int) {}
    @inlinable var wantsAbsorbing: Bool { false }
    @inlinable var mustAbsorb: Bool { false }
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
/// it runs it folds every stripe's local storage into the value (``StripeReadable/absorb(_:into:)``). A
/// reader whose stripe's local storage fills up folds that stripe in itself, under the mutex and its
/// own stripe, if the mutex is free (and the next reader, before it reads, waits for the mutex if the
/// storage is full and may not be dropped: ``StripeLocalStorage/mustAbsorb``); the other stripes'
/// readers go on meanwhile. The stripes are kept until the lock is freed: a lock
/// never shrinks back.
///
/// ThreadSanitizer sees every synchronization: readers and writers meet only on pthread mutexes
/// (which it intercepts), and the stripes are published once, with a release store of an atomic that
/// readers load with acquire ordering (which it models), after being initialized under the mutex.
@usableFromInline
struct ReadMostlyLock<Value: StripeReadable>: @unchecked Sendable {
    // @unchecked Sendable is sound: the value is written by a writer, which holds the mutex and every
    // stripe (so no reader holds any), or, in fields readers never read, by a reader folding in its
    // stripe under the mutex (which excludes writers and other folding readers); and it is read by a
    // reader holding the mutex (before the lock spreads: then it excludes every writer) or one stripe
    // (after: every writer needs it too). A stripe's local storage is touched only by the holder of
    // that stripe or by a writer holding all.
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
            stripes.absorbAll(into: value)
            return try body(&value.pointee)
        }
    }

    /// `read` of the value, which it must not change, under whichever lock readers take now.
    @inlinable @inline(__always)
    func read<Result>(_ read: (UnsafePointer<Value>) -> Result) -> Result {
        storage.access { value, _ in read(value) }
    }

    /// A read that may leave something for writers: `body` with the value, which it must not change
    /// through that pointer, and how the caller holds the lock: `exclusive` with the value, which it
    /// may change, while readers take the mutex; `shared` with the caller's stripe's local storage,
    /// which it may change, once the lock has spread (see ``ReadMostlyStorage/access(_:)``).
    @inlinable @inline(__always)
    func access<Result>(_ body: (UnsafePointer<Value>, ReadAccess<Value>) -> Result) -> Result {
        storage.access(body)
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

    /// Folds stripe `index`, which the caller holds and releases here, into `value` if the mutex is
    /// free now (otherwise a writer or another stripe's reader has it, and the caller goes on):
    /// under the mutex, which excludes writers, and that stripe alone, so that readers on the other
    /// stripes go on reading (see ``StripeReadable/absorb(_:into:)``).
    @inlinable @inline(never)
    static func absorbIfFree(
        stripe index: Int, of stripes: Stripes<Value.StripeLocal>, into value: UnsafeMutablePointer<Value>,
        _ words: UnsafeMutablePointer<Atomic<Int>>
    ) {
        let mutex = ReadMostlyStorage<Value>.mutex(in: words)
        if MutexWords.tryLock(mutex) {
            Value.absorb(&stripes.local(index).pointee, into: value)
            MutexWords.unlock(mutex)
        }
        MutexWords.unlock(stripes.mutex(index))
    }

    /// Folds stripe `index`, which the caller holds, into `value` once the mutex is free (for a stripe
    /// that must be folded in before its reader reads: ``StripeLocalStorage/mustAbsorb``). It lets go
    /// of the stripe to wait, as the lock order is the mutex, then the stripes, and returns holding
    /// it again, so that no other reader of the stripe adds to it in between.
    @inlinable @inline(never)
    static func absorbWaiting(
        stripe index: Int, of stripes: Stripes<Value.StripeLocal>, into value: UnsafeMutablePointer<Value>,
        _ words: UnsafeMutablePointer<Atomic<Int>>
    ) {
        let mutex = ReadMostlyStorage<Value>.mutex(in: words)
        MutexWords.unlock(stripes.mutex(index))
        MutexWords.lock(mutex)
        MutexWords.lock(stripes.mutex(index))
        Value.absorb(&stripes.local(index).pointee, into: value)
        MutexWords.unlock(mutex)
    }
}

/// How a reader holds a ``ReadMostlyLock`` (see ``ReadMostlyLock/access(_:)``).
@usableFromInline
enum ReadAccess<Value: StripeReadable> {
    /// The reader holds the mutex, which excludes every other reader and writer: it may change the
    /// value, through this pointer.
    case exclusive(UnsafeMutablePointer<Value>)
    /// The lock has spread and the reader holds one stripe: it may change that stripe's local
    /// storage, through this pointer, and not the value, which readers on other stripes read.
    case shared(UnsafeMutablePointer<Value.StripeLocal>)
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

    /// The body of ``ReadMostlyLock/access(_:)``, on the storage, so that a caller holding it unretained
    /// (`Unmanaged`'s guaranteed reference) reads without retaining it.
    ///
    /// `body` gets a pointer to the value, not the value itself: `inout` would be a write in
    /// ThreadSanitizer's eyes (it reports concurrent `inout` accesses as races, whatever they do),
    /// and a copy of a value with references would retain them, writes that every reader would
    /// share. Read the fields needed through the pointer (`$0.pointee.field`): a whole value passed on
    /// from `pointee` may be copied.
    ///
    /// Always inlined with `body`, which it calls in one place (so that the optimizer inlines it
    /// too); what it calls out of line takes no closure (a closure passed to a call that is not
    /// inlined is formed on every read, and a key path given as the closure is instantiated, at a
    /// cost of microseconds).
    @inlinable @inline(__always)
    final func access<Result>(_ body: (UnsafePointer<Value>, ReadAccess<Value>) -> Result) -> Result {
        withUnsafeMutablePointers { value, words in
            let mutex = Self.mutex(in: words)
            var address = words[0].load(ordering: .acquiring)
            if address == 0 {
                if !MutexWords.tryLock(mutex) {
                    address = ReadMostlyLock<Value>.enterContended(words)
                } else if words[0].load(ordering: .relaxed) != 0 {
                    // Spread between the load and the lock (the stripes are published under the mutex).
                    MutexWords.unlock(mutex)
                    address = words[0].load(ordering: .acquiring)
                }
            }
            // Not spread: the caller holds the mutex. Spread: it takes its processor's stripe.
            let stripes = address == 0 ? nil : Stripes<Value.StripeLocal>(address)
            let index = stripes?.current ?? 0
            if let stripes {
                MutexWords.lock(stripes.mutex(index))
                // A stripe whose contents may not be dropped is folded in before it is full and read.
                if stripes.local(index).pointee.mustAbsorb {
                    ReadMostlyLock<Value>.absorbWaiting(stripe: index, of: stripes, into: value, words)
                }
            }
            let result = body(
                UnsafePointer(value), stripes.map { .shared($0.local(index)) } ?? .exclusive(value))
            guard let stripes else {
                MutexWords.unlock(mutex)
                return result
            }
            if stripes.local(index).pointee.wantsAbsorbing {
                ReadMostlyLock<Value>.absorbIfFree(stripe: index, of: stripes, into: value, words)
            } else {
                MutexWords.unlock(stripes.mutex(index))
            }
            return result
        }
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
    @inlinable func absorbAll<Value: StripeReadable>(into value: UnsafeMutablePointer<Value>)
    where Value.StripeLocal == Local {
        for index in 0..<count { Value.absorb(&local(index).pointee, into: value) }
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
            stripes.local(index).initialize(to: Local(stripe: index))
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
