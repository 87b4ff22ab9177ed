package persistshard.companion.format;

import java.io.EOFException;
import java.io.IOException;
import java.net.URI;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * A part on a store that Hadoop's file systems open ({@code s3a://}, {@code gs://},
 * {@code hdfs://}: the URL the plan names), read by positioned reads of one
 * {@link FSDataInputStream} ({@code readFully(position, ...)}: no seek state shared between
 * reads). The file system is Hadoop's cached instance for the URL and the configuration
 * ({@link FileSystem#get}), which this source never closes; closing closes the stream only.
 *
 * <p>A part that ends before a range does throws {@link EOFException} (Hadoop's positioned
 * read does), reported as {@link CorruptData} like a truncated local file; a missing part
 * throws {@link java.io.FileNotFoundException}.
 */
public final class HadoopRangeSource implements RangeSource {
  private final String url;
  private final FSDataInputStream in;
  private final long size;

  private HadoopRangeSource(String url, FSDataInputStream in, long size) {
    this.url = url;
    this.in = in;
    this.size = size;
  }

  /** Opens {@code url} with the file system {@code conf} gives its scheme. */
  public static HadoopRangeSource open(String url, Configuration conf) throws IOException {
    Path path = new Path(URI.create(url));
    FileSystem fs = FileSystem.get(path.toUri(), conf);
    long size = fs.getFileStatus(path).getLen();
    return new HadoopRangeSource(url, fs.open(path), size);
  }

  @Override
  public long size() {
    return size;
  }

  @Override
  public byte[] read(long offset, int length) throws IOException {
    if (offset < 0 || offset + length > size) {
      throw new EOFException(url + " ends at " + size + ", wanted " + (offset + length));
    }
    byte[] out = new byte[length];
    in.readFully(offset, out, 0, length);
    return out;
  }

  @Override
  public void close() throws IOException {
    in.close();
  }
}
