package persistshard.companion.format;

import java.io.Closeable;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * Where a part's bytes come from: its size and ranged reads.
 *
 * <p>{@link #read} returns exactly the bytes asked for or throws; a source that ends early
 * (a truncated object) throws {@link java.io.EOFException}, which the reader reports as
 * {@link CorruptData}. Other I/O errors (a missing object, a network error) propagate.
 */
public interface RangeSource extends Closeable {

  /** Bytes in the part. */
  long size() throws IOException;

  /** {@code length} bytes starting at {@code offset}. */
  byte[] read(long offset, int length) throws IOException;

  /** A local file, read through one {@link FileChannel}. */
  static RangeSource file(Path path) throws IOException {
    FileChannel channel = FileChannel.open(path, StandardOpenOption.READ);
    return new RangeSource() {
      @Override
      public long size() throws IOException {
        return channel.size();
      }

      @Override
      public byte[] read(long offset, int length) throws IOException {
        ByteBuffer out = ByteBuffer.allocate(length);
        while (out.hasRemaining()) {
          int got = channel.read(out, offset + out.position());
          if (got < 0) {
            throw new java.io.EOFException(
                path + " ends at " + (offset + out.position()) + ", wanted " + (offset + length));
          }
        }
        return out.array();
      }

      @Override
      public void close() throws IOException {
        channel.close();
      }
    };
  }
}
