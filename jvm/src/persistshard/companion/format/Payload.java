package persistshard.companion.format;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.List;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.ipc.message.ArrowFieldNode;

/**
 * Decodes one column segment's payload into the field nodes and buffers of Arrow's IPC order
 * (a node, its buffers, then its children, pre-order), ready for
 * {@link org.apache.arrow.vector.VectorLoader} (docs/format.md, "Segments and payloads").
 *
 * <p>Invariants: every length in the node table is checked against the layout's rules and the
 * payload's size before any byte it names is read, the payload must be used exactly (no
 * trailing bytes), and a failed check is {@link SegmentError}, never another exception.
 * Buffers handed out are owned by the caller's list (one reference each), also on failure: the
 * caller closes them.
 */
final class Payload {
  /** A payload that does not match its type; the reader turns it into {@link CorruptData}. */
  static final class SegmentError extends Exception {
    private static final long serialVersionUID = 1L;

    SegmentError(String message) {
      super(message);
    }
  }

  private final byte[] data;
  private final int start;
  private final int end;
  private final ByteBuffer table;
  private final int words;
  private int word;
  private int pos;
  private final BufferAllocator allocator;
  private final List<ArrowFieldNode> nodes;
  private final List<ArrowBuf> buffers;

  private Payload(byte[] data, int start, int length, int words, BufferAllocator allocator,
      List<ArrowFieldNode> nodes, List<ArrowBuf> buffers) {
    this.data = data;
    this.start = start;
    this.end = start + length;
    this.table = ByteBuffer.wrap(data, start, 8 * words).slice().order(ByteOrder.LITTLE_ENDIAN);
    this.words = words;
    this.pos = start + 8 * words;
    this.allocator = allocator;
    this.nodes = nodes;
    this.buffers = buffers;
  }

  /**
   * Appends the nodes and buffers of the column of {@code numRows} rows stored in
   * {@code data[start, start + length)}.
   */
  static void decode(byte[] data, int start, int length, Layout layout, long numRows,
      BufferAllocator allocator, List<ArrowFieldNode> nodes, List<ArrowBuf> buffers)
      throws SegmentError {
    int words = layout.tableWords;
    if (length < 8L * words) {
      throw new SegmentError("payload of " + length + " bytes is shorter than its node table");
    }
    Payload p = new Payload(data, start, length, words, allocator, nodes, buffers);
    p.node(layout, numRows);
    p.finish();
  }

  /**
   * Decodes the top-level fixed-width column of {@code numRows} rows stored in {@code
   * data[start, start + length)} into {@code out} (its kind is {@link FlatValues#of} of
   * {@code layout}'s field), with the same checks as {@link #decode}.
   */
  static void decodeFlat(byte[] data, int start, int length, Layout layout, long numRows,
      FlatValues out) throws SegmentError {
    int words = layout.tableWords;
    if (length < 8L * words) {
      throw new SegmentError("payload of " + length + " bytes is shorter than its node table");
    }
    Payload p = new Payload(data, start, length, words, null, null, null);
    long[] counts = p.counts(layout, numRows);
    long n = counts[0];
    long nulls = counts[1];
    long[] sizes = p.slotSizes(layout, n, nulls);
    int validityAt = p.take(sizes[0]);
    int w = layout.width;
    if (sizes[1] != n * w) {
      throw new SegmentError(sizes[1] + " bytes of values for " + n + " rows of width " + w);
    }
    int at = p.take(sizes[1]);
    p.finish();
    out.reset((int) n, (int) nulls);
    if (nulls > 0) {
      System.arraycopy(data, validityAt, out.validity, 0, (int) sizes[0]);
    }
    flatValues(data, at, (int) n, w, layout.shuffle, out);
  }

  private void finish() throws SegmentError {
    if (word != words || pos != end) {
      throw new SegmentError("payload has trailing bytes");
    }
  }

  private long next() throws SegmentError {
    if (word >= words) {
      throw new SegmentError("node table ends early");
    }
    long v = table.getLong(8 * word++);
    if (v < 0) {
      throw new SegmentError("node table word " + Long.toUnsignedString(v) + " is out of range");
    }
    return v;
  }

  /** The offset of the next buffer of {@code size} bytes; moves past it and its padding. */
  private int take(long size) throws SegmentError {
    if (size > end - pos) {
      throw new SegmentError("buffer of " + size + " bytes at " + (pos - start) + " runs past the payload");
    }
    int at = pos;
    pos += (int) size;
    pos += (int) (-size & 7);
    if (pos > end) {
      pos = end + 1; // padding missing: reported as trailing-byte mismatch below
    }
    return at;
  }

  private ArrowBuf copy(int at, long size) {
    ArrowBuf buf = allocator.buffer(size);
    buffers.add(buf);
    buf.setBytes(0, data, at, size);
    buf.writerIndex(size);
    return buf;
  }

  /** A node's row count (which must be {@code expected}) and null count. */
  private long[] counts(Layout layout, long expected) throws SegmentError {
    long n = next();
    long nulls = next();
    if (n != expected) {
      throw new SegmentError("node of type " + layout.field.getType() + " has " + n + " rows, expected " + expected);
    }
    if (nulls > n) {
      throw new SegmentError(nulls + " nulls in " + n + " rows");
    }
    return new long[] {n, nulls};
  }

  /** The byte lengths of a node's buffer slots; the validity's checked against the counts. */
  private long[] slotSizes(Layout layout, long n, long nulls) throws SegmentError {
    long[] sizes = new long[layout.slots()];
    for (int i = 0; i < sizes.length; i++) {
      sizes[i] = next();
    }
    long bitmapBytes = (n + 7) / 8;
    if (sizes[0] != (nulls > 0 ? bitmapBytes : 0)) {
      throw new SegmentError("validity of " + sizes[0] + " bytes for " + n + " rows with " + nulls + " nulls");
    }
    return sizes;
  }

  private void node(Layout layout, long expected) throws SegmentError {
    long[] counts = counts(layout, expected);
    long n = counts[0];
    long nulls = counts[1];
    if (layout.kind == Layout.NULL) {
      if (nulls != n) {
        throw new SegmentError("null column with non-null values");
      }
      nodes.add(new ArrowFieldNode(n, n));
      return;
    }
    long[] sizes = slotSizes(layout, n, nulls);
    long bitmapBytes = (n + 7) / 8;
    nodes.add(new ArrowFieldNode(n, nulls));
    int validityAt = take(sizes[0]);
    if (nulls > 0) {
      copy(validityAt, sizes[0]);
    } else { // absent: every row valid. Arrow Java is handed the bitmap it would make itself
      ArrowBuf all = allocator.buffer(bitmapBytes);
      buffers.add(all);
      all.setOne(0, bitmapBytes);
      all.writerIndex(bitmapBytes);
    }
    switch (layout.kind) {
      case Layout.FIXED: {
        int w = layout.width;
        if (sizes[1] != n * w) {
          throw new SegmentError(sizes[1] + " bytes of values for " + n + " rows of width " + w);
        }
        int at = take(sizes[1]);
        fixedValues(at, (int) n, w, layout.shuffle, layout.widenTo);
        return;
      }
      case Layout.BOOL: {
        if (sizes[1] != bitmapBytes) {
          throw new SegmentError(sizes[1] + " bytes of booleans for " + n + " rows");
        }
        copy(take(sizes[1]), sizes[1]);
        return;
      }
      case Layout.VARBIN: {
        if (sizes[1] != n * layout.width) {
          throw new SegmentError(sizes[1] + " bytes of offsets for " + n + " rows");
        }
        int offsetsAt = take(sizes[1]);
        int dataAt = take(sizes[2]);
        offsets(offsetsAt, (int) n, layout.width, sizes[2]);
        copy(dataAt, sizes[2]);
        return;
      }
      case Layout.LIST: {
        if (sizes[1] != n * layout.width) {
          throw new SegmentError(sizes[1] + " bytes of offsets for " + n + " rows");
        }
        long last = offsets(take(sizes[1]), (int) n, layout.width, -1);
        node(layout.children.get(0), last);
        return;
      }
      case Layout.FIXED_LIST:
        node(layout.children.get(0), Math.multiplyExact(n, (long) layout.width));
        return;
      default: // STRUCT
        for (Layout c : layout.children) {
          node(c, n);
        }
    }
  }

  /**
   * Fixed-width values, unshuffled (byte j of value i is at j * n + i) and widened. The
   * unshuffle reads the byte planes in order and assembles eight (then four, then one) planes
   * at a time into a little-endian word, so each value is written whole: a byte-at-a-time
   * gather over planes {@code n} bytes apart was most of a decimal scan's time.
   */
  private void fixedValues(int at, int n, int w, boolean shuffled, int widenTo) {
    int out = widenTo > 0 ? widenTo : w;
    long size = (long) n * out;
    if (!shuffled && widenTo == 0) {
      copy(at, size);
      return;
    }
    byte[] values = new byte[(int) size];
    if (shuffled) {
      unshuffle(data, at, n, w, values, out);
    } else {
      for (int i = 0; i < n; i++) {
        System.arraycopy(data, at + i * w, values, i * out, w);
      }
    }
    if (out > w) { // sign-extend a narrow decimal's two's complement value
      for (int i = 0; i < n; i++) {
        int base = i * out;
        byte fill = (byte) (values[base + w - 1] < 0 ? 0xFF : 0);
        Arrays.fill(values, base + w, base + out, fill);
      }
    }
    ArrowBuf buf = allocator.buffer(size);
    buffers.add(buf);
    buf.setBytes(0, values);
    buf.writerIndex(size);
  }

  private static final VarHandle LONGS =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final VarHandle INTS =
      MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);

  /**
   * Writes the {@code n} values of {@code w} bytes stored as byte planes at {@code
   * src[at, at + n * w)} (byte j of value i at {@code at + j * n + i}) into {@code dst}, value
   * i's byte j at {@code i * stride + j}; bytes {@code [w, stride)} of each value untouched.
   *
   * <p>Eight planes at a time (four, then one, for what is left of {@code w}), eight values
   * at a time ({@link #transpose}), one store per value. The last {@code n % 8} values go byte
   * by byte.
   */
  static void unshuffle(byte[] src, int at, int n, int w, byte[] dst, int stride) {
    int whole = n & ~7;
    long[] x = new long[8];
    int j = 0;
    for (; j + 4 <= w; j += j + 8 <= w ? 8 : 4) {
      boolean eight = j + 8 <= w;
      int p = at + j * n;
      for (int i = 0; i < whole; i += 8) {
        transpose(src, p, n, i, eight, x, 0);
        int o = i * stride + j;
        for (int m = 0; m < 8; m++) {
          if (eight) {
            LONGS.set(dst, o + m * stride, x[m]);
          } else {
            INTS.set(dst, o + m * stride, (int) x[m]);
          }
        }
      }
      for (int k = 0; k < (eight ? 8 : 4); k++) {
        for (int i = whole; i < n; i++) {
          dst[i * stride + j + k] = src[p + k * n + i];
        }
      }
    }
    for (; j < w; j++) {
      int p = at + j * n;
      for (int i = 0; i < n; i++) {
        dst[i * stride + j] = src[p + i];
      }
    }
  }

  /**
   * Values {@code i .. i + 7} of the byte planes starting at {@code src[p]} ({@code n} bytes
   * apart): eight planes ({@code eight}) or four (the upper four bytes then 0), as
   * little-endian words into {@code out[o .. o + 7]}. One 8-byte load per plane and an 8 x 8
   * byte transpose in registers.
   */
  private static void transpose(byte[] src, int p, int n, int i, boolean eight, long[] out, int o) {
    long x0 = (long) LONGS.get(src, p + i);
    long x1 = (long) LONGS.get(src, p + n + i);
    long x2 = (long) LONGS.get(src, p + 2 * n + i);
    long x3 = (long) LONGS.get(src, p + 3 * n + i);
    long x4 = 0;
    long x5 = 0;
    long x6 = 0;
    long x7 = 0;
    if (eight) {
      x4 = (long) LONGS.get(src, p + 4 * n + i);
      x5 = (long) LONGS.get(src, p + 5 * n + i);
      x6 = (long) LONGS.get(src, p + 6 * n + i);
      x7 = (long) LONGS.get(src, p + 7 * n + i);
    }
    // Row k holds byte k of values i..i+7; swap blocks of 4, 2, then 1 byte so that row
    // m holds the bytes of value i + m.
    long t;
    t = ((x0 >>> 32) ^ x4) & 0xFFFFFFFFL; x0 ^= t << 32; x4 ^= t;
    t = ((x1 >>> 32) ^ x5) & 0xFFFFFFFFL; x1 ^= t << 32; x5 ^= t;
    t = ((x2 >>> 32) ^ x6) & 0xFFFFFFFFL; x2 ^= t << 32; x6 ^= t;
    t = ((x3 >>> 32) ^ x7) & 0xFFFFFFFFL; x3 ^= t << 32; x7 ^= t;
    t = ((x0 >>> 16) ^ x2) & 0x0000FFFF0000FFFFL; x0 ^= t << 16; x2 ^= t;
    t = ((x1 >>> 16) ^ x3) & 0x0000FFFF0000FFFFL; x1 ^= t << 16; x3 ^= t;
    t = ((x4 >>> 16) ^ x6) & 0x0000FFFF0000FFFFL; x4 ^= t << 16; x6 ^= t;
    t = ((x5 >>> 16) ^ x7) & 0x0000FFFF0000FFFFL; x5 ^= t << 16; x7 ^= t;
    t = ((x0 >>> 8) ^ x1) & 0x00FF00FF00FF00FFL; x0 ^= t << 8; x1 ^= t;
    t = ((x2 >>> 8) ^ x3) & 0x00FF00FF00FF00FFL; x2 ^= t << 8; x3 ^= t;
    t = ((x4 >>> 8) ^ x5) & 0x00FF00FF00FF00FFL; x4 ^= t << 8; x5 ^= t;
    t = ((x6 >>> 8) ^ x7) & 0x00FF00FF00FF00FFL; x6 ^= t << 8; x7 ^= t;
    out[o] = x0;
    out[o + 1] = x1;
    out[o + 2] = x2;
    out[o + 3] = x3;
    out[o + 4] = x4;
    out[o + 5] = x5;
    out[o + 6] = x6;
    out[o + 7] = x7;
  }

  /**
   * The {@code n} values of {@code w} bytes at {@code src[at, at + n * w)}, byte planes when
   * {@code shuffled} (else value i at {@code at + i * w}), into {@code out}'s array: the low
   * {@code min(w, 8)} bytes of each value, two's complement, sign-extended to the array's
   * width (the stored bytes above the eighth are a decimal's sign extension at the precisions
   * {@link FlatValues} takes, and are not read).
   */
  static void flatValues(byte[] src, int at, int n, int w, boolean shuffled, FlatValues out) {
    int planes = Math.min(w, 8);
    if (planes != 4 && planes != 8) {
      throw new IllegalStateException("no flat decoding for values of " + w + " bytes");
    }
    boolean eight = planes == 8;
    boolean ints = out.kind == FlatValues.INT;
    if (ints && eight) {
      throw new IllegalStateException("no flat int decoding for values of " + w + " bytes");
    }
    long[] longs = out.longs;
    int[] intOut = out.ints;
    if (!shuffled) {
      for (int i = 0; i < n; i++) {
        int o = at + i * w;
        if (eight) {
          longs[i] = (long) LONGS.get(src, o);
        } else if (ints) {
          intOut[i] = (int) INTS.get(src, o);
        } else {
          longs[i] = (int) INTS.get(src, o);
        }
      }
      return;
    }
    int whole = n & ~7;
    if (eight) {
      for (int i = 0; i < whole; i += 8) {
        transpose(src, at, n, i, true, longs, i);
      }
    } else {
      long[] x = new long[8];
      for (int i = 0; i < whole; i += 8) {
        transpose(src, at, n, i, false, x, 0);
        for (int m = 0; m < 8; m++) {
          if (ints) {
            intOut[i + m] = (int) x[m];
          } else {
            longs[i + m] = (int) x[m];
          }
        }
      }
    }
    for (int i = whole; i < n; i++) {
      long v = 0;
      for (int j = planes - 1; j >= 0; j--) {
        v = (v << 8) | (src[at + j * n + i] & 0xFF);
      }
      if (ints) {
        intOut[i] = (int) v;
      } else {
        longs[i] = eight ? v : (int) v;
      }
    }
  }

  /**
   * Arrow's n + 1 offsets from n shuffled lengths; checks they are non-negative, fit the
   * offset width and (for VARBIN, {@code total >= 0}) end at {@code total}. Returns the last.
   */
  private long offsets(int at, int n, int w, long total) throws SegmentError {
    ArrowBuf buf = allocator.buffer((long) (n + 1) * w);
    buffers.add(buf);
    long sum = 0;
    long max = w == 4 ? Integer.MAX_VALUE : Long.MAX_VALUE;
    if (w == 4) {
      buf.setInt(0, 0);
    } else {
      buf.setLong(0, 0);
    }
    for (int i = 0; i < n; i++) {
      long v = 0;
      for (int j = w - 1; j >= 0; j--) {
        v = (v << 8) | (data[at + j * n + i] & 0xFF);
      }
      if (w == 4) {
        v = (int) v;
      }
      if (v < 0) {
        throw new SegmentError("negative list or string length");
      }
      if (v > max - sum) {
        throw new SegmentError("offsets overflow");
      }
      sum += v;
      if (w == 4) {
        buf.setInt(4L * (i + 1), (int) sum);
      } else {
        buf.setLong(8L * (i + 1), sum);
      }
    }
    buf.writerIndex((long) (n + 1) * w);
    if (total >= 0 && sum != total) {
      throw new SegmentError("offsets end at " + sum + ", data holds " + total + " bytes");
    }
    return sum;
  }
}
