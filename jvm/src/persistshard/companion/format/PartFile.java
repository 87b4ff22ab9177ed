package persistshard.companion.format;

import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.github.luben.zstd.ZstdDecompressCtx;
import com.github.luben.zstd.ZstdException;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.zip.CRC32C;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.VectorLoader;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.message.ArrowFieldNode;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * A part file opened for reading in the JVM: the footer parsed and checked, then any chunk's
 * chosen columns decoded into Arrow vectors (docs/format.md; the JVM twin of Python's
 * {@code persistshard.format.part.PartReader}). Reads format versions 1, 2 and 3.
 *
 * <p>Invariants:
 * <ul>
 *   <li>Nothing decoded is returned unless the crc32c of every byte it came from matched: the
 *       footer before it is parsed, each segment before it is decompressed or decoded. Any
 *       failed check (magic, version, length, checksum, structure) is {@link CorruptData}
 *       naming the file and, where one is involved, the chunk.</li>
 *   <li>Only ranged reads: {@link #open} reads the tail (the last 64 KiB, or the footer exactly
 *       if larger); {@link #readChunk} reads only the segments of the columns asked for,
 *       nearby ones in one read.</li>
 *   <li>An opened part is immutable and may be read from several threads at once.</li>
 * </ul>
 */
public final class PartFile {
  public static final int[] READ_VERSIONS = {1, 2, 3};
  static final byte[] MAGIC = "PSPART".getBytes(StandardCharsets.US_ASCII);
  static final int HEADER_SIZE = 8;
  static final int TAIL_SIZE = 16;
  static final int TAIL_READ = 64 << 10;
  /** Segments this close (and at most a quarter of what a read wants) are read together. */
  static final int HOLE_BYTES = 64 << 10;

  private static final ObjectMapper JSON =
      new ObjectMapper().enable(JsonParser.Feature.STRICT_DUPLICATE_DETECTION);

  /** One column of one chunk: where its stored bytes are and what they must check out to. */
  public static final class Segment {
    public final long offset;
    public final long length;
    public final long rawLength;
    public final long crc32c;
    public final boolean plain;

    Segment(long offset, long length, long rawLength, long crc32c, boolean plain) {
      this.offset = offset;
      this.length = length;
      this.rawLength = rawLength;
      this.crc32c = crc32c;
      this.plain = plain;
    }
  }

  /**
   * A chunk as the footer indexes it. {@code stats} (format version 2 and later) holds each
   * column's raw {@code [min, max, null_count]} entry; null in version 1, where only the sort
   * column's bounds ({@code keyMin}, {@code keyMax}, {@code keyNullCount}) are known.
   */
  public static final class Chunk {
    public final long offset;
    public final long length;
    public final long numRows;
    public final Long minTime;
    public final Long maxTime;
    public final JsonNode keyMin;
    public final JsonNode keyMax;
    public final long keyNullCount;
    public final List<Segment> segments;
    public final List<JsonNode> stats;

    Chunk(long offset, long length, long numRows, Long minTime, Long maxTime, JsonNode keyMin,
        JsonNode keyMax, long keyNullCount, List<Segment> segments, List<JsonNode> stats) {
      this.offset = offset;
      this.length = length;
      this.numRows = numRows;
      this.minTime = minTime;
      this.maxTime = maxTime;
      this.keyMin = keyMin;
      this.keyMax = keyMax;
      this.keyNullCount = keyNullCount;
      this.segments = segments;
      this.stats = stats;
    }
  }

  public final String name;
  public final long size;
  public final int version;
  public final Schema schema;
  public final String sortColumn;
  public final long numRows;
  public final List<Chunk> chunks;
  public final Map<String, String> metadata;
  final List<Layout> layouts;
  private final Map<String, Integer> index;
  private final RangeSource source;

  private PartFile(String name, long size, int version, RangeSource source, JsonNode footer, long footerStart) {
    this.name = name;
    this.size = size;
    this.version = version;
    this.source = source;
    if (!footer.isObject()) {
      throw new CorruptData("footer is not a JSON object", name, -1);
    }
    JsonNode v = Layout.get(footer, "version");
    if (!v.isIntegralNumber() || v.longValue() != version) {
      throw new CorruptData("footer says format version " + v + ", the tail " + version, name, -1);
    }
    JsonNode codec = Layout.get(footer, "codec");
    if (!codec.isTextual() || !codec.textValue().equals("zstd")) {
      throw new CorruptData("unknown codec " + codec, name, -1);
    }
    JsonNode schemaJson = Layout.get(footer, "schema");
    JsonNode fields = Layout.get(schemaJson, "fields");
    if (!fields.isArray()) {
      throw new IllegalArgumentException("'fields' has the wrong JSON type");
    }
    List<Layout> layouts = new ArrayList<>();
    List<Field> arrowFields = new ArrayList<>();
    Map<String, Integer> index = new LinkedHashMap<>();
    for (JsonNode f : fields) {
      Layout layout = Layout.ofField(f);
      if (index.put(layout.field.getName(), layouts.size()) != null) {
        throw new IllegalArgumentException("duplicate column " + layout.field.getName());
      }
      layouts.add(layout);
      arrowFields.add(layout.field);
    }
    this.layouts = List.copyOf(layouts);
    this.index = index;
    this.schema = new Schema(arrowFields, Layout.metadata(schemaJson.get("metadata")));
    JsonNode meta = Layout.get(footer, "metadata");
    if (!meta.isObject()) {
      throw new IllegalArgumentException("metadata must map strings to strings");
    }
    Map<String, String> metadata = new LinkedHashMap<>();
    meta.properties().forEach(e -> {
      if (!e.getValue().isTextual()) {
        throw new IllegalArgumentException("metadata must map strings to strings");
      }
      metadata.put(e.getKey(), e.getValue().textValue());
    });
    this.metadata = metadata;
    JsonNode sort = Layout.get(footer, "sort_column");
    if (!sort.isNull() && !(sort.isTextual() && index.containsKey(sort.textValue()))) {
      throw new IllegalArgumentException("sort column " + sort + " is not in the schema");
    }
    this.sortColumn = sort.isNull() ? null : sort.textValue();
    JsonNode chunkList = Layout.get(footer, "chunks");
    if (!chunkList.isArray()) {
      throw new IllegalArgumentException("chunks must be a list");
    }
    int ncols = layouts.size();
    long offset = HEADER_SIZE;
    long rows = 0;
    List<Chunk> chunks = new ArrayList<>();
    for (int i = 0; i < chunkList.size(); i++) {
      JsonNode c = chunkList.get(i);
      if (nonNegative(c, "offset") != offset) {
        throw new CorruptData("chunk starts at " + c.get("offset") + ", expected " + offset, name, i);
      }
      JsonNode columns = Layout.get(c, "columns");
      if (!columns.isArray() || columns.size() != ncols) {
        throw new CorruptData("chunk indexes " + columns.size() + " columns, schema has " + ncols, name, i);
      }
      List<Segment> segments = new ArrayList<>();
      long pos = offset;
      for (JsonNode col : columns) {
        int n = col.isArray() ? col.size() : -1;
        if (!(n == 3 || (n == 4 && version >= 3))) {
          throw new IllegalArgumentException("a column entry is [length, raw_length, crc32c], integers");
        }
        long[] e = new long[n];
        for (int j = 0; j < n; j++) {
          JsonNode x = col.get(j);
          if (!x.isIntegralNumber() || !x.canConvertToLong() || x.longValue() < 0) {
            throw new IllegalArgumentException("column entry " + col + " out of range");
          }
          e[j] = x.longValue();
        }
        if (e[2] > 0xFFFFFFFFL) {
          throw new IllegalArgumentException("column entry " + col + " out of range");
        }
        boolean plain = n == 4;
        if (plain && (e[3] != 1 || e[0] - e[1] < 0 || e[0] - e[1] >= 8)) {
          throw new IllegalArgumentException("plain column entry " + col + ": bad marker or padding");
        }
        segments.add(new Segment(pos, e[0], e[1], e[2], plain));
        pos += e[0];
      }
      long length = nonNegative(c, "length");
      if (pos - offset != length) {
        throw new CorruptData("chunk length " + length + " is not the sum of its columns", name, i);
      }
      long numRows = nonNegative(c, "num_rows");
      if (numRows == 0) {
        throw new CorruptData("chunk has no rows", name, i);
      }
      List<JsonNode> stats = null;
      if (version >= 2) {
        JsonNode entries = Layout.get(c, "stats");
        if (!entries.isArray() || entries.size() != ncols) {
          throw new IllegalArgumentException("stats must hold one entry per column");
        }
        stats = new ArrayList<>();
        for (JsonNode e : entries) {
          JsonNode nulls = e.isArray() && e.size() == 3 ? e.get(2) : null;
          if (nulls == null || !nulls.isIntegralNumber() || nulls.longValue() < 0 || nulls.longValue() > numRows
              || e.get(0).isNull() != e.get(1).isNull()) {
            throw new IllegalArgumentException("malformed column statistics " + e);
          }
          stats.add(e);
        }
      }
      JsonNode keyMin = Layout.get(c, "key_min");
      JsonNode keyMax = Layout.get(c, "key_max");
      if (sortColumn == null && !(keyMin.isNull() && keyMax.isNull())) {
        throw new IllegalArgumentException("key statistics without a sort column");
      }
      chunks.add(new Chunk(offset, length, numRows, time(c, "min_time"), time(c, "max_time"), keyMin,
          keyMax, nonNegative(c, "key_null_count"), List.copyOf(segments),
          stats == null ? null : List.copyOf(stats)));
      rows += numRows;
      offset += length;
    }
    if (offset != footerStart) {
      throw new CorruptData("chunks end at " + offset + ", footer starts at " + footerStart, name, -1);
    }
    this.chunks = List.copyOf(chunks);
    this.numRows = nonNegative(footer, "num_rows");
    if (numRows != rows) {
      throw new CorruptData("footer says " + numRows + " rows, chunks hold " + rows, name, -1);
    }
  }

  private static long nonNegative(JsonNode obj, String key) {
    JsonNode v = Layout.get(obj, key);
    if (!v.isIntegralNumber() || !v.canConvertToLong() || v.longValue() < 0) {
      throw new IllegalArgumentException("'" + key + "' must be a non-negative integer, got " + v);
    }
    return v.longValue();
  }

  private static Long time(JsonNode obj, String key) {
    JsonNode v = Layout.get(obj, key);
    if (v.isNull()) {
      return null;
    }
    if (!v.isIntegralNumber() || !v.canConvertToLong()) {
      throw new IllegalArgumentException("'" + key + "' must be an integer, got " + v);
    }
    return v.longValue();
  }

  /** Opens the part {@code name}: reads and checks the tail and the footer. */
  public static PartFile open(String name, RangeSource source) throws IOException {
    long size = source.size();
    if (size < HEADER_SIZE + TAIL_SIZE) {
      throw new CorruptData("not a part: " + size + " bytes is shorter than a header and a tail ("
          + (HEADER_SIZE + TAIL_SIZE) + " bytes)", name, -1);
    }
    int fetch = (int) Math.min(size, TAIL_READ);
    byte[] buf = read(source, name, -1, size - fetch, fetch);
    ByteBuffer tail = ByteBuffer.wrap(buf, fetch - TAIL_SIZE, TAIL_SIZE).slice().order(ByteOrder.LITTLE_ENDIAN);
    long footerLength = Integer.toUnsignedLong(tail.getInt(0));
    long footerCrc = Integer.toUnsignedLong(tail.getInt(4));
    int version = Short.toUnsignedInt(tail.getShort(8));
    if (!Arrays.equals(buf, fetch - 6, fetch, MAGIC, 0, 6)) {
      throw new CorruptData("not a part: tail magic is not PSPART", name, -1);
    }
    if (Arrays.stream(READ_VERSIONS).noneMatch(x -> x == version)) {
      throw new CorruptData("tail says format version " + version + "; this reader reads versions 1, 2, 3", name, -1);
    }
    long footerStart = size - TAIL_SIZE - footerLength;
    if (footerStart < HEADER_SIZE) {
      throw new CorruptData("footer of " + footerLength + " bytes does not fit a part of " + size + " bytes", name, -1);
    }
    byte[] footer;
    if (footerStart >= size - fetch) {
      int at = (int) (footerStart - (size - fetch));
      footer = Arrays.copyOfRange(buf, at, at + (int) footerLength);
    } else {
      footer = read(source, name, -1, footerStart, (int) footerLength);
    }
    CRC32C crc = new CRC32C();
    crc.update(footer);
    if (crc.getValue() != footerCrc) {
      throw new CorruptData("footer checksum mismatch", name, -1);
    }
    if (size <= fetch) { // the whole file was read: check the header too
      checkHeader(buf, name, version);
    }
    JsonNode parsed;
    try {
      parsed = JSON.readTree(new String(footer, StandardCharsets.UTF_8));
    } catch (IOException e) {
      throw new CorruptData("footer is not JSON: " + e.getMessage(), name, -1, e);
    }
    try {
      return new PartFile(name, size, version, source, parsed, footerStart);
    } catch (CorruptData e) {
      throw e;
    } catch (RuntimeException e) {
      throw new CorruptData("malformed footer: " + e.getMessage(), name, -1, e);
    }
  }

  private static void checkHeader(byte[] header, String name, int version) {
    if (!Arrays.equals(header, 0, 6, MAGIC, 0, 6)) {
      throw new CorruptData("not a part: header magic is not PSPART", name, -1);
    }
    int v = (header[6] & 0xFF) | ((header[7] & 0xFF) << 8);
    if (v != version) {
      throw new CorruptData("header says format version " + v + ", the tail " + version, name, -1);
    }
  }

  private static byte[] read(RangeSource source, String name, int chunk, long offset, int length) throws IOException {
    try {
      return source.read(offset, length);
    } catch (EOFException e) {
      throw new CorruptData("short read: " + e.getMessage(), name, chunk, e);
    }
  }

  /** The index of each named column, in the order given; IllegalArgumentException if absent. */
  public int[] columns(List<String> names) {
    if (names == null) {
      int[] all = new int[layouts.size()];
      Arrays.setAll(all, i -> i);
      return all;
    }
    int[] out = new int[names.size()];
    for (int i = 0; i < out.length; i++) {
      Integer at = index.get(names.get(i));
      if (at == null) {
        throw new IllegalArgumentException("column '" + names.get(i) + "' is not in part " + name
            + " (columns " + index.keySet() + ")");
      }
      out[i] = at;
    }
    return out;
  }

  /** The schema of the given columns (as {@link #columns} indexes them), in that order. */
  public Schema projectedSchema(int[] cols) {
    List<Field> fields = new ArrayList<>();
    for (int c : cols) {
      fields.add(layouts.get(c).field);
    }
    return new Schema(fields, schema.getCustomMetadata());
  }

  /**
   * Reads and decodes columns {@code cols} of chunk {@code chunk} into {@code root}, whose
   * schema must be {@link #projectedSchema}{@code (cols)}: its vectors are replaced and its
   * row count set. Every segment's crc32c is checked before its bytes are decompressed or
   * decoded; a failed check leaves {@code root} as it was.
   */
  public void readChunk(int chunk, int[] cols, VectorSchemaRoot root, BufferAllocator allocator)
      throws IOException {
    readChunk(chunk, cols, new FlatValues[cols.length], root, allocator);
  }

  /**
   * The holders of columns {@code cols} that decode without an Arrow vector ({@link
   * FlatValues#of}; null for the others), for {@link #readChunk(int, int[], FlatValues[],
   * VectorSchemaRoot, BufferAllocator)}.
   */
  public FlatValues[] flatColumns(int[] cols) {
    FlatValues[] out = new FlatValues[cols.length];
    for (int k = 0; k < cols.length; k++) {
      Layout layout = layouts.get(cols[k]);
      out[k] = layout.kind == Layout.FIXED ? FlatValues.of(layout.field) : null;
    }
    return out;
  }

  /**
   * As {@link #readChunk(int, int[], VectorSchemaRoot, BufferAllocator)}, except that column
   * {@code cols[k]} is decoded into {@code flat[k]} where that is not null ({@link
   * #flatColumns}), and {@code root}'s schema is the projected schema of the other columns, in
   * their order. The same checks, before anything is decoded; on failure the holders may hold
   * some of the chunk's values (a reader that failed does not hand them out).
   */
  public void readChunk(int chunk, int[] cols, FlatValues[] flat, VectorSchemaRoot root,
      BufferAllocator allocator) throws IOException {
    Chunk info = chunks.get(chunk);
    byte[][] stored = fetch(chunk, cols);
    for (int k = 0; k < cols.length; k++) {
      Segment seg = info.segments.get(cols[k]);
      CRC32C crc = new CRC32C();
      crc.update(stored[k]);
      if (crc.getValue() != seg.crc32c) {
        throw new CorruptData("checksum mismatch in column '" + layouts.get(cols[k]).field.getName() + "'", name, chunk);
      }
    }
    List<ArrowFieldNode> nodes = new ArrayList<>();
    List<ArrowBuf> buffers = new ArrayList<>();
    try {
      for (int k = 0; k < cols.length; k++) {
        Segment seg = info.segments.get(cols[k]);
        byte[] bytes = stored[k];
        Layout layout = layouts.get(cols[k]);
        try {
          byte[] payload = bytes;
          int at = (int) (seg.length - seg.rawLength);
          if (seg.plain) {
            layout = layout.unshuffled();
          } else {
            payload = decompress(bytes, seg.rawLength);
            at = 0;
          }
          if (flat[k] != null) {
            Payload.decodeFlat(payload, at, (int) seg.rawLength, layout, info.numRows, flat[k]);
          } else {
            Payload.decode(payload, at, (int) seg.rawLength, layout, info.numRows, allocator, nodes, buffers);
          }
        } catch (Payload.SegmentError e) {
          throw new CorruptData("column '" + layout.field.getName() + "': " + e.getMessage(), name, chunk, e);
        }
      }
      try (ArrowRecordBatch batch = new ArrowRecordBatch((int) info.numRows, nodes, buffers)) {
        new VectorLoader(root).load(batch);
      } catch (RuntimeException e) {
        throw new CorruptData("Arrow refused the decoded columns: " + e.getMessage(), name, chunk, e);
      }
    } finally {
      for (ArrowBuf b : buffers) {
        b.close();
      }
    }
  }

  private static final ThreadLocal<ZstdDecompressCtx> ZSTD = ThreadLocal.withInitial(ZstdDecompressCtx::new);

  /**
   * Per thread, the array payloads are decompressed into, reused: a payload is only read
   * while its segment is decoded (the decoders copy what they keep), and a thread decodes
   * one segment at a time.
   */
  private static final ThreadLocal<byte[][]> SCRATCH = ThreadLocal.withInitial(() -> new byte[1][0]);

  /** The payload of a zstd frame, in {@code [0, rawLength)} of a per-thread array. */
  private static byte[] decompress(byte[] frame, long rawLength) throws Payload.SegmentError {
    if (rawLength > Integer.MAX_VALUE - 8) {
      throw new Payload.SegmentError("payload of " + rawLength + " bytes is too large for the JVM reader");
    }
    byte[][] scratch = SCRATCH.get();
    if (scratch[0].length < rawLength) {
      scratch[0] = new byte[(int) rawLength];
    }
    byte[] out = scratch[0];
    if (rawLength == 0 && frame.length == 0) {
      return out;
    }
    int got;
    try {
      got = ZSTD.get().decompressByteArray(out, 0, (int) rawLength, frame, 0, frame.length);
    } catch (ZstdException e) {
      throw new Payload.SegmentError("zstd frame does not decompress: " + e.getMessage());
    }
    if (got != rawLength) {
      throw new Payload.SegmentError("zstd frame expands to " + got + " bytes, footer says " + rawLength);
    }
    return out;
  }

  /** The stored bytes of columns {@code cols} of a chunk; nearby segments in one read. */
  private byte[][] fetch(int chunk, int[] cols) throws IOException {
    Chunk info = chunks.get(chunk);
    Integer[] order = new Integer[cols.length];
    for (int i = 0; i < cols.length; i++) {
      order[i] = i;
    }
    Arrays.sort(order, (a, b) -> Long.compare(info.segments.get(cols[a]).offset, info.segments.get(cols[b]).offset));
    byte[][] out = new byte[cols.length][];
    int i = 0;
    while (i < order.length) {
      Segment first = info.segments.get(cols[order[i]]);
      long start = first.offset;
      long end = first.offset + first.length;
      long wanted = first.length;
      int j = i + 1;
      while (j < order.length) {
        Segment s = info.segments.get(cols[order[j]]);
        long hole = s.offset - end;
        if (hole > HOLE_BYTES || hole > (wanted + s.length) / 4 || s.offset + s.length - start > Integer.MAX_VALUE - 8) {
          break;
        }
        end = Math.max(end, s.offset + s.length);
        wanted += s.length;
        j++;
      }
      if (end - start > Integer.MAX_VALUE - 8) {
        throw new CorruptData("segment of " + (end - start) + " bytes is too large for the JVM reader", name, chunk);
      }
      byte[] run = read(source, name, chunk, start, (int) (end - start));
      for (int k = i; k < j; k++) {
        Segment s = info.segments.get(cols[order[k]]);
        int at = (int) (s.offset - start);
        out[order[k]] = Arrays.copyOfRange(run, at, at + (int) s.length);
      }
      i = j;
    }
    return out;
  }
}
