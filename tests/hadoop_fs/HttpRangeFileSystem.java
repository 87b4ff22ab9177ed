package persistshard.testfs;

import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.net.URL;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * A read-only Hadoop file system for tests (tests/test_s3.py): {@code s3a://bucket/key} served
 * by plain HTTP from the S3 endpoint the configuration names ({@code fs.s3a.endpoint}, a
 * local moto server, which answers unsigned requests): a HEAD for a file's length, a GET
 * with a {@code Range} header per positioned read. Registered for a session with
 * {@code spark.hadoop.fs.s3a.impl}: it stands in for hadoop-aws's S3A, which pyspark does not
 * ship, so that the companion's reads through Hadoop's API run for real. Without the
 * endpoint in the configuration it refuses to initialize (the configuration must reach the
 * executors).
 */
public final class HttpRangeFileSystem extends FileSystem {
  private URI uri;
  private String endpoint;

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    setConf(conf);
    uri = URI.create(name.getScheme() + "://" + name.getAuthority());
    endpoint = conf.get("fs.s3a.endpoint");
    if (endpoint == null) {
      throw new IOException("HttpRangeFileSystem: fs.s3a.endpoint is not in the configuration");
    }
  }

  @Override
  public String getScheme() {
    return "s3a";
  }

  @Override
  public URI getUri() {
    return uri;
  }

  private URL url(Path path) throws IOException {
    URI u = makeQualified(path).toUri();
    return new URL(endpoint + "/" + u.getAuthority() + u.getPath());
  }

  @Override
  public FileStatus getFileStatus(Path path) throws IOException {
    HttpURLConnection c = (HttpURLConnection) url(path).openConnection();
    c.setRequestMethod("HEAD");
    int code = c.getResponseCode();
    if (code == 404) {
      throw new FileNotFoundException(path.toString());
    }
    if (code != 200) {
      throw new IOException("HEAD " + path + ": HTTP " + code);
    }
    return new FileStatus(c.getContentLengthLong(), false, 1, 1 << 20, 0, makeQualified(path));
  }

  @Override
  public FSDataInputStream open(Path path, int bufferSize) throws IOException {
    return new FSDataInputStream(new RangeStream(url(path), getFileStatus(path).getLen()));
  }

  /** Positioned reads by ranged GETs; the stream's own position serves plain reads. */
  static final class RangeStream extends FSInputStream {
    private final URL url;
    private final long length;
    private long pos;

    RangeStream(URL url, long length) {
      this.url = url;
      this.length = length;
    }

    @Override
    public int read(long position, byte[] buffer, int offset, int n) throws IOException {
      if (position >= length) {
        return -1;
      }
      int want = (int) Math.min(n, length - position);
      if (want == 0) {
        return 0;
      }
      HttpURLConnection c = (HttpURLConnection) url.openConnection();
      c.setRequestProperty("Range", "bytes=" + position + "-" + (position + want - 1));
      if (c.getResponseCode() != 206) {
        throw new IOException("GET " + url + " range at " + position + ": HTTP "
            + c.getResponseCode());
      }
      int got = 0;
      try (InputStream in = c.getInputStream()) {
        while (got < want) {
          int r = in.read(buffer, offset + got, want - got);
          if (r < 0) {
            break;
          }
          got += r;
        }
      }
      return got;
    }

    @Override
    public void readFully(long position, byte[] buffer, int offset, int n) throws IOException {
      int done = 0;
      while (done < n) {
        int r = read(position + done, buffer, offset + done, n - done);
        if (r <= 0) {
          throw new EOFException(url + " ends at " + (position + done));
        }
        done += r;
      }
    }

    @Override
    public int read() throws IOException {
      byte[] one = new byte[1];
      if (read(pos, one, 0, 1) <= 0) {
        return -1;
      }
      pos++;
      return one[0] & 0xff;
    }

    @Override
    public int read(byte[] buffer, int offset, int n) throws IOException {
      int r = read(pos, buffer, offset, n);
      if (r > 0) {
        pos += r;
      }
      return r;
    }

    @Override
    public void seek(long position) {
      pos = position;
    }

    @Override
    public long getPos() {
      return pos;
    }

    @Override
    public boolean seekToNewSource(long target) {
      return false;
    }
  }

  private static IOException readOnly() {
    return new IOException("HttpRangeFileSystem is read-only");
  }

  @Override
  public FSDataOutputStream create(Path f, FsPermission permission, boolean overwrite,
      int bufferSize, short replication, long blockSize, Progressable progress)
      throws IOException {
    throw readOnly();
  }

  @Override
  public FSDataOutputStream append(Path f, int bufferSize, Progressable progress)
      throws IOException {
    throw readOnly();
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    throw readOnly();
  }

  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    throw readOnly();
  }

  @Override
  public FileStatus[] listStatus(Path f) throws IOException {
    throw new IOException("HttpRangeFileSystem does not list");
  }

  /** Paths are absolute: the bucket's root is the only working directory. */
  @Override
  public void setWorkingDirectory(Path dir) {
    throw new UnsupportedOperationException("HttpRangeFileSystem works at the bucket's root");
  }

  @Override
  public Path getWorkingDirectory() {
    return new Path(uri.toString() + "/");
  }

  @Override
  public boolean mkdirs(Path f, FsPermission permission) throws IOException {
    throw readOnly();
  }
}
